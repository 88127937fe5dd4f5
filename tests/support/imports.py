"""The imports of a Python file, read from its source (no import runs): what the layout tests
of the source tree and of the tests check their rules against."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path


def imports(root: Path, path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) for each module the file at ``path`` (under ``root``) imports, in
    functions too: ``from m import n`` imports the submodule ``m.n`` when there is one, else
    ``m``."""
    def is_module(dotted: str) -> bool:
        file = root.joinpath(*dotted.split("."))
        return file.with_suffix(".py").is_file() or (file / "__init__.py").is_file()

    package = path.relative_to(root).parent.parts
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            parts = [*package[:len(package) - node.level + 1]] if node.level else []
            module = ".".join([*parts, node.module] if node.module else parts)
            for alias in node.names:
                submodule = f"{module}.{alias.name}"
                yield node.lineno, submodule if is_module(submodule) else module
