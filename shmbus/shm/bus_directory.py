"""The bus directory: created private (0700), refused when it belongs to someone else."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def prepare_directory(directory: Path) -> None:
    """Create ``directory`` (mode 0700) if missing; check that the current user owns it.

    Raises PermissionError naming the owner when another user owns it; a directory of ours
    that is open to others is tightened to 0700.
    """
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = directory.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"bus directory {directory} is not a directory")
    if st.st_uid != os.geteuid():
        raise PermissionError(
            f"bus directory {directory} is owned by uid {st.st_uid}, not by you (uid "
            f"{os.geteuid()}); use your own directory (SHMBUS_DIR or connect(dir=...))")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(directory, 0o700)
