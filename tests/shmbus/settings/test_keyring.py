"""The keyring file (shmbus/settings/keyring.py) and ``shmbus keygen``."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shmbus.cli import app
from shmbus.settings.channel_uri import ChannelUri, ChannelUriError
from shmbus.settings.keyring import (
    KeyringError,
    keyring_path,
    load_keyring,
    new_key_line,
    parse_keyring,
)

SECRET = base64.b64encode(bytes(32)).decode()


def write(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def test_a_channel_names_the_key_by_name_and_only_on_udp() -> None:
    assert ChannelUri.parse("aeron:udp?endpoint=h:1|key=prod-a").key == "prod-a"
    assert ChannelUri.parse("aeron:udp?endpoint=h:1").key is None
    with pytest.raises(ChannelUriError, match="not a parameter of ipc"):
        ChannelUri.parse("aeron:ipc?key=prod-a")
    with pytest.raises(ChannelUriError, match="never the secret"):
        ChannelUri.parse(f"aeron:udp?endpoint=h:1|key={SECRET}")


def test_keys_of_a_name_come_with_the_sealing_key_last() -> None:
    keyring = parse_keyring(f"# comment\nk 1 {SECRET}\n\nk 2 {SECRET} receive-only\n"
                            f"other 3 {SECRET}  # trailing comment\nk 4 {SECRET}\n")
    assert [(k.key_id, k.seals) for k in keyring.keys_of("k")] == [(1, True), (2, False),
                                                                   (4, True)]
    assert [k.key_id for k in keyring.keys_of("other")] == [3]
    reordered = parse_keyring(f"k 4 {SECRET}\nk 1 {SECRET}\nk 2 {SECRET} receive-only\n")
    assert [k.key_id for k in reordered.keys_of("k")] == [4, 2, 1]
    with pytest.raises(KeyringError, match="no key named 'x'.*shmbus keygen x"):
        keyring.keys_of("x")
    with pytest.raises(KeyringError, match="receive-only"):
        parse_keyring(f"r 9 {SECRET} receive-only\n").keys_of("r")


@pytest.mark.parametrize(("text", "wrong"), [
    ("k 1", "expected 'name id secret"),
    (f"k 1 {SECRET} sometimes", "expected 'name id secret"),
    (f"k/x 1 {SECRET}", "not a key name"),
    (f"k 0 {SECRET}", "not 1 to 4294967295"),
    (f"k 4294967296 {SECRET}", "not 1 to 4294967295"),
    (f"k one {SECRET}", "not 1 to 4294967295"),
    (f"k 1 {SECRET}\nj 1 {SECRET}", "line 2: key id 1 is already used"),
    ("k 1 !!!!", "not base64"),
    (f"k 1 {base64.b64encode(bytes(16)).decode()}", "16 bytes, not 32"),
])
def test_a_bad_line_is_refused_naming_its_line_and_never_the_secret(text: str,
                                                                    wrong: str) -> None:
    with pytest.raises(KeyringError, match=wrong) as error:
        parse_keyring(text, "ring")
    assert SECRET not in str(error.value) and "ring line" in str(error.value)


def test_secrets_stay_out_of_reprs() -> None:
    keyring = parse_keyring(new_key_line("k"))
    secret = base64.b64encode(keyring.keys[0].secret).decode()
    assert secret not in repr(keyring) and repr(keyring.keys[0].secret) not in repr(keyring)


def test_a_keyring_others_may_read_or_that_is_not_this_users_is_refused(tmp_path: Path) -> None:
    ring = write(tmp_path / "ring", new_key_line("k") + "\n", 0o644)
    with pytest.raises(KeyringError, match="mode 0644.*chmod 600"):
        load_keyring(ring)
    ring.chmod(0o600)
    assert load_keyring(ring).keys_of("k")
    if os.getuid() == 0:
        os.chown(ring, 12345, -1)
        with pytest.raises(KeyringError, match="belongs to uid 12345"):
            load_keyring(ring)
    with pytest.raises(KeyringError, match="No such file.*SHMBUS_KEYRING"):
        load_keyring(tmp_path / "missing")
    with pytest.raises(KeyringError, match="Is a directory"):
        load_keyring(tmp_path)


def test_the_default_keyring_is_in_the_users_config() -> None:
    assert keyring_path("") == Path.home() / ".config" / "shmbus" / "keyring"
    assert keyring_path("~/ring") == Path.home() / "ring"


def test_keygen_creates_a_private_keyring_and_appends_new_keys(tmp_path: Path) -> None:
    ring = tmp_path / "conf" / "keyring"
    runner = CliRunner()
    first = runner.invoke(app, ["keygen", "prod-a", "--keyring", str(ring)])
    second = runner.invoke(app, ["keygen", "prod-a", "--keyring", str(ring), "--receive-only"])
    assert first.exit_code == 0 and second.exit_code == 0, first.output + second.output
    assert stat.S_IMODE(ring.stat().st_mode) == 0o600
    keys = load_keyring(ring).keys_of("prod-a")
    assert [k.seals for k in keys] == [False, True] and keys[0].key_id != keys[1].key_id
    assert ring.read_text().splitlines()[0] in first.output
    bad = runner.invoke(app, ["keygen", "no/slash", "--keyring", str(ring)])
    assert bad.exit_code == 1 and "not a key name" in bad.output
