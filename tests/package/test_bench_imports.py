"""bench/ is a library (``bench/lib/``) and thin entry scripts: no bench module imports an entry script
(a module of bench/ that runs as ``python -m bench.X``: ``if __name__ == "__main__"``), at the top or
inside a function. Read with ``ast``, nothing imported."""

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _modules() -> dict[str, Path]:
    return {
        ".".join(p.relative_to(BENCH.parent).with_suffix("").parts): p
        for p in BENCH.rglob("*.py")
        if "results" not in p.relative_to(BENCH).parts
    }


def _is_entry(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            names = [node.test.left, *node.test.comparators]
            if any(isinstance(n, ast.Name) and n.id == "__name__" for n in names) and any(
                isinstance(n, ast.Constant) and n.value == "__main__" for n in names
            ):
                return True
    return False


def _imported(tree: ast.Module, module: str) -> set[str]:
    """Every bench module ``module`` imports (``from bench import x`` names module ``bench.x`` when it is one)."""
    got: set[str] = set()
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            got.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            got.add(base)
            got.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in got if m == "bench" or m.startswith("bench.")}


def test_the_scan_finds_the_entry_scripts():
    mods = _modules()
    entries = {m for m, p in mods.items() if _is_entry(ast.parse(p.read_text()))}
    assert {"bench.scale", "bench.serve_latency", "bench.nested_bodies"} <= entries
    assert not any(m.startswith("bench.lib") for m in entries), "bench.lib holds no entry script"


def test_no_bench_module_imports_an_entry_script():
    mods = _modules()
    trees = {m: ast.parse(p.read_text(), str(p)) for m, p in mods.items()}
    entries = {m for m, t in trees.items() if _is_entry(t)}
    bad = sorted(f"{m} imports {e}" for m, t in trees.items() for e in _imported(t, m) & entries)
    assert not bad, "bench entry scripts are run, not imported (share code through bench/lib/):\n" + "\n".join(bad)


def test_the_scan_sees_an_import_of_an_entry_script():
    tree = ast.parse("from bench import serve_latency\ndef f():\n    from bench.scale import main\n")
    assert {"bench.serve_latency", "bench.scale"} <= _imported(tree, "bench.x")


def test_every_package_module_a_bench_imports_exists():
    """A bench imports the package's modules by name inside its functions too, where running a test would not
    reach them: every ``offgraph.*`` module named is a file or package of the source tree (a module renamed
    without its benches fails here, not in the middle of a bench run)."""
    src = BENCH.parent
    missing = []
    for module, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("offgraph"):
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("offgraph")]
            for name in names:
                p = src.joinpath(*name.split("."))
                if not (p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()):
                    missing.append(f"{module}: {name}")
    assert not missing, missing
