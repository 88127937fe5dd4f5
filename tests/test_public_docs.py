"""Every name of the public API says what it is: help(shmbus) is documentation users read.

Each class, function, method and property that ``shmbus.__all__`` exposes (inherited ones from
the C core included, and those of its two namespaces, ``codes`` and ``idle_strategies``) has a
docstring and an entry in the API reference (docs/api/); the package docstring names the entry
points; and the public face stays small: at most 45 names.
"""

from __future__ import annotations

import inspect
import types
from pathlib import Path

import shmbus

API_PAGES = Path(__file__).resolve().parents[1] / "docs" / "api"
#: the most names the top package may export
MOST_NAMES = 45


def _public_members(cls: type) -> list[tuple[str, object]]:
    members = []
    for name in dir(cls):
        if name.startswith("_") and name not in ("__call__", "__aiter__"):
            continue
        if name in {"name"} or any(name in vars(base) for base in (object, BaseException)):
            continue
        members.append((name, inspect.getattr_static(cls, name)))
    return members


def _public_objects() -> list[tuple[str, object]]:
    """(dotted name, object) for each name of ``shmbus.__all__``, a namespace's public
    members in its place."""
    found = []
    for name in shmbus.__all__:
        obj = getattr(shmbus, name)
        if isinstance(obj, types.ModuleType):
            found += [(f"{name}.{member}", value) for member, value in vars(obj).items()
                      if not member.startswith("_") and getattr(value, "__module__", obj.__name__)
                      == obj.__name__ and not isinstance(value, types.ModuleType)
                      and member not in ("annotations",)]
        else:
            found.append((name, obj))
    return found


def test_the_public_face_has_at_most_45_names_each_in_the_reference() -> None:
    assert len(shmbus.__all__) <= MOST_NAMES, sorted(shmbus.__all__)
    reference = "\n".join(page.read_text() for page in API_PAGES.glob("*.md"))
    missing = [name for name, _ in _public_objects() if f"::: shmbus.{name}\n" not in reference]
    assert missing == []


def test_every_public_class_function_method_and_property_has_a_docstring() -> None:
    undocumented = []
    for name, obj in _public_objects():
        if not (inspect.isclass(obj) or callable(obj)) or isinstance(obj, int):
            continue
        if not inspect.getdoc(obj):
            undocumented.append(name)
        if not inspect.isclass(obj) or issubclass(obj, int):
            continue
        for member, value in _public_members(obj):
            if isinstance(value, staticmethod | classmethod):
                value = value.__func__
            if not (callable(value) or inspect.isdatadescriptor(value)):
                continue  # plain class attributes (constants)
            if not inspect.getdoc(value):
                undocumented.append(f"{name}.{member}")
    assert undocumented == []


def test_help_of_the_package_names_its_entry_points() -> None:
    doc = inspect.getdoc(shmbus) or ""
    for entry in ("connect", "add_publication", "add_subscription", "poll", "timeout"):
        assert entry in doc, entry
