"""A private module ``P._x`` is the implementation of package ``P``: only modules inside ``P``
import it, and where ``P`` has a public front ``P.x``, only that front does; everything else
goes through the front, so the private module can change without breaking its readers. A private
twin beside a front is worth its split only where both halves are large (``streaming._stream_train``
under ``stream_train``); a small half belongs in its front, and the rule below then has nothing to check.

Outside the package (``tests/``, ``bench/``, ``examples/``) only a private module's own tests import
it: ``P._x`` of subpackage ``offgraph.S`` only from ``tests/S/test_x.py`` or ``tests/S/test_x_*.py``;
benchmarks and examples never, they read the package as its users do.

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


def privates(name: str):
    """Each private module on the dotted path ``name`` (``a._b._c`` -> ``a._b``, ``a._b._c``)."""
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        if is_private(".".join(parts[:i])):
            yield ".".join(parts[:i])


def violations(root: Path, package: str, pending: frozenset[str] | set[str] = frozenset()) -> list[str]:
    modules = module_names(root, package)
    out = []
    for importer, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        for line, name in imported(tree, importer, path.name == "__init__.py", modules):
            for private in privates(name):
                why = None if private in pending else allowed(importer, private, modules)
                if why is not None:
                    out.append(f"{path.relative_to(root)}:{line}: imports {private} ({why} may)")
    return sorted(set(out))


OUTSIDE = ("tests/**/*.py", "bench/*.py", "examples/*.py")


def own_test(package: str, private: str) -> tuple[str, str]:
    """``(folder, x)``: the own tests of ``private`` = ``package.S[...]._x`` are ``folder/test_x.py`` and
    ``folder/test_x_*.py``, with ``folder`` = ``tests/S``."""
    subpackage = private.removeprefix(package + ".").partition(".")[0]
    return f"tests/{subpackage}", private.rpartition(".")[2][1:]


def outside_violations(root: Path, package: str) -> list[str]:
    """Imports of ``package``'s private modules from the files of ``OUTSIDE`` that are not their own tests."""
    modules = module_names(root, package)
    out = []
    for path in sorted({p for pattern in OUTSIDE for p in root.glob(pattern)}):
        rel = path.relative_to(root)
        tree = ast.parse(path.read_text(), str(path))
        importer = ".".join(rel.with_suffix("").parts)
        for line, name in imported(tree, importer, path.name == "__init__.py", modules):
            for private in privates(name) if name.startswith(package + ".") else ():
                folder, x = own_test(package, private)
                if rel.parent.as_posix() == folder and (rel.stem == f"test_{x}" or rel.stem.startswith(f"test_{x}_")):
                    continue
                out.append(f"{rel}:{line}: imports {private} (only {folder}/test_{x}.py, test_{x}_*.py may)")
    return sorted(set(out))


def test_private_modules_are_imported_through_their_front():
    bad = violations(REPO, "offgraph", set())
    assert not bad, "private modules imported from outside their front:\n" + "\n".join(bad)


def test_tests_benchmarks_and_examples_import_private_modules_only_from_their_own_tests():
    bad = outside_violations(REPO, "offgraph")
    assert not bad, "private modules imported outside the package, not from their own tests:\n" + "\n".join(bad)


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


def test_the_rule_outside_a_small_package(tmp_path):
    write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a/__init__.py": "",
            "pkg/a/_x.py": "",
            "pkg/a/x.py": "from pkg.a._x import f\n",
            "pkg/a/d/__init__.py": "from pkg.a.d._y import g\n",
            "pkg/a/d/_y.py": "",
            "tests/a/test_x.py": "from pkg.a._x import f\n",  # its own test
            "tests/a/test_x_more.py": "from pkg.a import _x\n",  # its own test too
            "tests/a/test_xy.py": "import pkg.a._x\n",  # another name
            "tests/b/test_x.py": "from pkg.a._x import f\n",  # another package's folder
            "tests/a/test_y.py": "from pkg.a.d._y import g\nimport _thread\n",  # nested: folder a
            "tests/conftest.py": "from pkg.a.x import f\n",  # through the front
            "tests/helpers.py": "from pkg.a._x import f\n",
            "bench/test_x.py": "import importlib\nimportlib.import_module('pkg.a._x')\n",
            "examples/demo.py": "def main():\n    from pkg.a.d import _y\n",
        },
    )
    assert outside_violations(tmp_path, "pkg") == [
        "bench/test_x.py:2: imports pkg.a._x (only tests/a/test_x.py, test_x_*.py may)",
        "examples/demo.py:2: imports pkg.a.d._y (only tests/a/test_y.py, test_y_*.py may)",
        "tests/a/test_xy.py:1: imports pkg.a._x (only tests/a/test_x.py, test_x_*.py may)",
        "tests/b/test_x.py:1: imports pkg.a._x (only tests/a/test_x.py, test_x_*.py may)",
        "tests/helpers.py:1: imports pkg.a._x (only tests/a/test_x.py, test_x_*.py may)",
    ]
