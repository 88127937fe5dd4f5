"""Every name of the public API says what it is: help(shmbus) is documentation users read.

Each class, function, method and property that ``shmbus.__all__`` exposes (inherited ones from
the C core included) has a docstring; the package docstring names the entry points.
"""

from __future__ import annotations

import inspect

import shmbus


def _public_members(cls: type) -> list[tuple[str, object]]:
    members = []
    for name in dir(cls):
        if name.startswith("_") and name not in ("__call__", "__aiter__"):
            continue
        if name in {"name"} or any(name in vars(base) for base in (object, BaseException)):
            continue
        members.append((name, inspect.getattr_static(cls, name)))
    return members


def test_every_public_class_function_method_and_property_has_a_docstring() -> None:
    undocumented = []
    for name in shmbus.__all__:
        obj = getattr(shmbus, name)
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
