"""shmbus/shm/_native.pyi names everything the C module exports, and nothing it does not.

Type checkers read the stub, never the C code, so a method added to _native.c without a line in
the stub is invisible to them; this test catches that.
"""

from __future__ import annotations

import ast
import types
from pathlib import Path

from shmbus.shm import _native

STUB = Path(_native.__file__).with_name("_native.pyi")
STUB_ONLY = {"Buffer", "WritableBuffer"}  # type aliases for annotations, no runtime object


def _kind(node: ast.FunctionDef) -> str:
    decorators = {ast.unparse(d) for d in node.decorator_list}
    return "property" if "property" in decorators or any(
        d.endswith(".setter") for d in decorators) else "method"


def _stub() -> tuple[set[str], dict[str, dict[str, str]]]:
    """(module-level names, {class name: {member name: "property" or "method"}}) of the stub."""
    tree = ast.parse(STUB.read_text())
    names: set[str] = set()
    classes: dict[str, dict[str, str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names.add(node.name)
            classes[node.name] = {n.name: _kind(n) for n in node.body
                                  if isinstance(n, ast.FunctionDef) and n.name != "__init__"}
        elif isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names, classes


def _runtime_members(cls: type) -> dict[str, str]:
    """What the C type defines itself: {name: "property" or "method"}."""
    members = {}
    for name, value in vars(cls).items():
        if name.startswith("__") and name != "__call__":
            continue
        is_data = isinstance(value, types.GetSetDescriptorType | types.MemberDescriptorType)
        members[name] = "property" if is_data else "method"
    return members


def test_the_stub_names_every_export_of_the_module() -> None:
    names, _ = _stub()
    exported = {name for name in vars(_native) if not name.startswith("__")}
    assert exported == names - STUB_ONLY
    assert STUB_ONLY <= names


def test_the_stub_has_every_method_and_property_of_each_type_as_what_it_is() -> None:
    _, classes = _stub()
    assert set(classes) == {name for name in vars(_native) if isinstance(getattr(_native, name),
                                                                          type)}
    for name, members in classes.items():
        assert _runtime_members(getattr(_native, name)) == members, name
    # e.g. a publication's position is a property, as an image's is
    assert classes["PublicationCore"]["position"] == classes["ImageCore"]["position"] == "property"
