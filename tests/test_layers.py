"""The layering gate: every import in pyforge/ follows DESIGN.md's table, with no exceptions.

    face      pyforge/__init__.py, errors, options, compiler, cli, backend, explain, models
    serve, generate      through the face and exec (generate may build onnx protobufs)
    exec      never ir, ops, frontend, opt, lower_numba, onnx (a saved plan runs without them)
    lower     ir, ops, opt, and exec's two data modules (plan, steps: the contract it produces)
    opt       ir, ops
    frontend  ir, ops (the only compiler layer that imports onnx)
    ops       ir
    ir        errors only

Lazy imports inside functions count too. ``errors`` is importable from everywhere.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "pyforge"
FACE = {"__init__", "__main__", "options", "compiler", "cli", "backend", "explain", "models"}
# the exec modules that are plain data (import nothing of pyforge but errors): lowering builds them
EXEC_DATA = {"pyforge.exec.plan", "pyforge.exec.steps"}
ALLOWED = {
    "errors": set(),
    "ir": set(),
    "ops": {"ir"},
    "frontend": {"ir", "ops"},
    "opt": {"ir", "ops"},
    "lower_numba": {"ir", "ops", "opt", "exec-data"},
    "exec": set(),
    "generate": {"face", "exec", "exec-data"},
    "serve": {"face", "exec", "exec-data", "generate"},
}
# generate writes decoder files (GGUF -> ONNX): it builds protobufs, it compiles nothing
ONNX_OK = {"frontend", "face", "generate"}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "face"
    if module in EXEC_DATA:
        return "exec-data"
    return parts[1] if parts[1] in ALLOWED else "face" if parts[1] in FACE else parts[1]


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level) for every import in the file."""
    tree = ast.parse(path.read_text())
    package = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]
    top = {id(n) for n in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.append((mod, node.lineno, id(node) in top))
            # `from . import x` may name submodules
            found += [(f"{mod}.{a.name}", node.lineno, id(node) in top) for a in node.names]
    return found


def _all_files() -> list[Path]:
    return sorted(ROOT.rglob("*.py"))


def _known(module: str) -> bool:
    dotted = ROOT.parent / Path(*module.split("."))
    return dotted.with_suffix(".py").exists() or (dotted / "__init__.py").exists()


def test_every_import_follows_the_layer_table():
    bad = []
    for path in _all_files():
        me = _module(path)
        mine = _layer(me)
        allowed = ALLOWED.get("exec" if mine == "exec-data" else mine)
        for mod, line, _ in _imports(path):
            root = mod.split(".")[0]
            where = f"{path.relative_to(ROOT.parent)}:{line}"
            if root == "onnx" and (mine not in ONNX_OK):
                bad.append(f"{where}: {mine} imports onnx")
            if root != "pyforge" or not _known(mod) or mod == "pyforge.errors":
                continue
            theirs = _layer(mod)
            if allowed is None or theirs == mine or (mine == "exec-data" and theirs == "exec"):
                continue
            if mine == "exec" and theirs == "exec-data":
                continue
            if theirs not in allowed:
                bad.append(f"{where}: {mine} ({me}) imports {theirs} ({mod})")
    assert not bad, "imports against DESIGN.md's layer table:\n" + "\n".join(sorted(set(bad)))


def test_no_import_cycle_among_module_level_imports():
    graph: dict[str, set[str]] = {}
    for path in _all_files():
        me = _module(path)
        graph[me] = {
            mod
            for mod, _, top in _imports(path)
            if top and mod.startswith("pyforge") and _known(mod) and mod != me
        }

    # a package's __init__ importing its own submodules is how packages are assembled, not a cycle
    def edges(m: str) -> set[str]:
        return {d for d in graph.get(m, ()) if not m.startswith(d + ".") and d != m}

    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(edges(m)):
            if state.get(d) == 1:
                cycle = stack[stack.index(d) :] + [d]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_importing_exec_pulls_no_onnx_and_no_compiler_layer():
    code = (
        "import sys, pyforge.exec, pyforge.exec.plan;"
        "import importlib, pkgutil;"
        "[importlib.import_module(m.name) for m in pkgutil.walk_packages("
        "pyforge.exec.__path__, 'pyforge.exec.') if 'cuda' not in m.name];"
        "layers = ('onnx', 'pyforge.frontend', 'pyforge.opt', 'pyforge.lower_numba',"
        " 'pyforge.ops', 'pyforge.ir');"
        "bad = sorted(m for m in sys.modules if m in layers or m.startswith("
        "tuple(f'{x}.' for x in layers)));"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
