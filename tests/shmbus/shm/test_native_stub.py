"""shmbus/shm/_native.pyi and netbridge/_io.pyi name everything their C module exports, and
nothing it does not.

Type checkers read the stub, never the C code, so a method added to a native source without a
line in the stub is invisible to them; this test catches that.
"""

from __future__ import annotations

import ast
import types
from pathlib import Path

import pytest

from netbridge import _io
from shmbus.shm import _native

# type aliases for annotations, no runtime object
STUB_ONLY = {_native: {"Buffer", "WritableBuffer"}, _io: set()}
HIDDEN = {"_C_API"}  # the capsule netbridge._io imports: for C, not Python
MODULES = pytest.mark.parametrize("module", [_native, _io], ids=["_native", "_io"])


def _kind(node: ast.FunctionDef) -> str:
    decorators = {ast.unparse(d) for d in node.decorator_list}
    return "property" if "property" in decorators or any(
        d.endswith(".setter") for d in decorators) else "method"


def _stub(module: types.ModuleType) -> tuple[set[str], dict[str, dict[str, str]]]:
    """(module-level names, {class name: {member name: "property" or "method"}}) of the stub."""
    assert module.__file__ is not None
    stub = Path(module.__file__).with_name(module.__name__.rpartition(".")[2] + ".pyi")
    tree = ast.parse(stub.read_text())
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


@MODULES
def test_the_stub_names_every_export_of_the_module(module: types.ModuleType) -> None:
    names, _ = _stub(module)
    exported = {name for name in vars(module) if not name.startswith("__")} - HIDDEN
    assert exported == names - STUB_ONLY[module]
    assert STUB_ONLY[module] <= names


@MODULES
def test_the_stub_has_every_method_and_property_of_each_type_as_what_it_is(
        module: types.ModuleType) -> None:
    _, classes = _stub(module)
    assert set(classes) == {name for name in vars(module) if isinstance(getattr(module, name),
                                                                         type)}
    for name, members in classes.items():
        assert _runtime_members(getattr(module, name)) == members, name


def test_a_publications_position_is_a_property_as_an_images_is() -> None:
    _, classes = _stub(_native)
    assert classes["PublicationCore"]["position"] == classes["ImageCore"]["position"] == "property"
