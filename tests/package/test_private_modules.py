"""A private module ``P._x`` is the implementation of package ``P``: only modules inside ``P``
import it, and where ``P`` has a public front ``P.x``, only that front does; everything else
goes through the front, so the private module can change without breaking its readers.

Checked on the source (``ast``), so every import counts, lazy ones and those under
``TYPE_CHECKING`` included.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def module_names(root: Path, package: str) -> dict[str, Path]:
    """Dotted name -> file of every module of ``package`` under ``root`` (a package by its ``__init__``)."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def is_private(name: str) -> bool:
    last = name.rpartition(".")[2]
    return last.startswith("_") and not last.startswith("__")


def imported(tree: ast.AST, importer: str, is_package: bool, modules: dict[str, Path]):
    """``(line, module name)`` of each module ``tree`` imports: ``import a.b``, ``from a import b``
    (``a.b`` when it is a module, else ``a``), relative imports, ``import_module("a.b")``."""
    here = importer if is_package else importer.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            yield node.lineno, base
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    yield node.lineno, f"{base}.{alias.name}"
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value


def allowed(importer: str, private: str, modules: dict[str, Path]) -> str | None:
    """None if ``importer`` may import ``private``, else the module(s) that may."""
    package, _, last = private.rpartition(".")
    if importer == private or importer.startswith(private + "."):
        return None
    front = f"{package}.{last[1:]}"
    if front in modules:
        return None if importer == front else f"only its front {front}"
    if importer == package or importer.startswith(package + "."):
        return None
    return f"only the modules of {package}"


def violations(root: Path, package: str, pending: frozenset[str] | set[str] = frozenset()) -> list[str]:
    modules = module_names(root, package)
    out = []
    for importer, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        for line, name in imported(tree, importer, path.name == "__init__.py", modules):
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                private = ".".join(parts[:i])
                if not is_private(private) or private in pending:
                    continue
                why = allowed(importer, private, modules)
                if why is not None:
                    out.append(f"{path.relative_to(root)}:{line}: imports {private} ({why} may)")
    return sorted(set(out))


def test_private_modules_are_imported_through_their_front():
    bad = violations(REPO, "offgraph", set())
    assert not bad, "private modules imported from outside their front:\n" + "\n".join(bad)


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_the_rule_on_a_small_package(tmp_path):
    write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a/__init__.py": "",
            "pkg/a/_x.py": "",
            "pkg/a/x.py": "from pkg.a._x import f\n",  # the front
            "pkg/a/y.py": "from . import _x\n",  # same package, but x.py is the front
            "pkg/a/_z.py": "",  # no front: its package may import it
            "pkg/a/w.py": "from ._z import g\n",
            "pkg/b.py": "import pkg.a._z\nimport importlib\nimportlib.import_module('pkg.a._x')\n",
            "pkg/c.py": "from pkg.a import x, _x\n",
            "pkg/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a._x import f\n",
        },
    )
    assert violations(tmp_path, "pkg") == [
        "pkg/a/y.py:1: imports pkg.a._x (only its front pkg.a.x may)",
        "pkg/b.py:1: imports pkg.a._z (only the modules of pkg.a may)",
        "pkg/b.py:3: imports pkg.a._x (only its front pkg.a.x may)",
        "pkg/c.py:1: imports pkg.a._x (only its front pkg.a.x may)",
        "pkg/d.py:3: imports pkg.a._x (only its front pkg.a.x may)",
    ]
    assert violations(tmp_path, "pkg", {"pkg.a._x"}) == ["pkg/b.py:1: imports pkg.a._z (only the modules of pkg.a may)"]
