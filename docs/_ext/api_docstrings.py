"""A griffe extension for the API reference: the docstrings users see in ``help()``.

Applied to each package mkdocstrings loads, once it is loaded:

* A compiled module (the native core) with a ``.pyi`` stub beside it: griffe may read either.
  Its objects and signatures come from the stub (inspecting a compiled method finds no
  parameters); its docstrings from the compiled module, the text
  ``help()`` shows (the stub's docstrings are notes for developers). The compiled docstrings'
  first line repeats the signature (``offer(*buffers, reserved_value=0) -> int``), which the
  page shows above them already: it is dropped.
* Settings and constants documented by ``#:`` comments above them (as Sphinx reads them),
  which griffe does not take, get those comments as their docstring.
* reST roles (:class:`Context`, :func:`register`) become code spans, and a ``::`` that
  introduces a code block a colon, as Markdown shows them.

No module is named here: a compiled module is recognised by its files.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|func|meth|attr|data|exc|mod|obj):`~?([^`]+)`")
SIGNATURE_LINE = re.compile(r"^\w+\(.*\)(\s*->.*)?$")


def _objects(obj: griffe.Object) -> Iterator[griffe.Object]:
    """``obj`` and every object defined in it (aliases, which point elsewhere, left out)."""
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _objects(member)  # type: ignore[arg-type]


def _stub_beside(module: griffe.Module) -> Path | None:
    """The ``.pyi`` of a compiled module, whichever of the two griffe read."""
    path = module.filepath
    if not isinstance(path, Path):
        return None
    stem = path.name.split(".")[0]
    stub = path.with_name(f"{stem}.pyi")
    compiled = any(path.parent.glob(f"{stem}.*.so"))
    return stub if compiled and stub.is_file() else None


def _runtime_docstring(obj: griffe.Object) -> str | None:
    """The docstring the imported object has, without a first line repeating the signature."""
    module = obj.module
    try:
        target: Any = importlib.import_module(module.path)
        for name in obj.path[len(module.path) + 1:].split("."):
            target = getattr(target, name)
    except (ImportError, AttributeError):
        return None
    doc = getattr(target, "__doc__", None)
    if not isinstance(doc, str) or not doc.strip():
        return None
    doc = inspect.cleandoc(doc)
    first, _, rest = doc.partition("\n")
    if SIGNATURE_LINE.match(first.strip()) and rest.strip():
        return rest.strip()
    return doc


def _comment_docstring(obj: griffe.Object) -> str | None:
    """The ``#:`` comment lines just above an attribute, as its docstring."""
    if not obj.is_attribute or not obj.lineno or not isinstance(obj.filepath, Path):
        return None
    if obj.filepath not in obj.lines_collection:
        return None
    lines = obj.lines_collection[obj.filepath]
    comment: list[str] = []
    index = obj.lineno - 2
    while 0 <= index < len(lines) and lines[index].strip().startswith("#:"):
        comment.insert(0, lines[index].strip()[2:].strip())
        index -= 1
    return " ".join(comment) or None


def _markdown(text: str) -> str:
    text = ROLE.sub(lambda match: f"`{match.group(1).split('.')[-1]}`", text)
    return re.sub(r"(\S)::$", r"\1:", text, flags=re.MULTILINE)


class ApiDocstrings(griffe.Extension):
    """Compiled modules as their stubs declare them; ``#:`` comments; reST as Markdown."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader,
                   **kwargs: Any) -> None:
        compiled = set()
        for obj in list(_objects(pkg)):
            if not obj.is_module:
                continue
            stub = _stub_beside(obj)  # type: ignore[arg-type]
            if stub is None:
                continue
            compiled.add(obj.path)
            if obj.filepath != stub:  # griffe inspected the compiled module: use the stub
                stubs = griffe.visit(obj.path, stub, stub.read_text(), parent=obj.parent,
                                     docstring_parser=loader.docstring_parser,
                                     docstring_options=loader.docstring_options)
                obj.imports.update(stubs.imports)
                for name, member in stubs.members.items():
                    obj.set_member(name, member)
        for obj in _objects(pkg):
            text = obj.docstring.value if obj.docstring else None
            if not obj.is_module and obj.module.path in compiled:
                text = _runtime_docstring(obj) or text
            if text is None:
                text = _comment_docstring(obj)
            if text is None:
                continue
            if obj.docstring is None:
                obj.docstring = griffe.Docstring(text, parent=obj,
                                                 parser=loader.docstring_parser,
                                                 parser_options=loader.docstring_options)
            obj.docstring.value = _markdown(text)
