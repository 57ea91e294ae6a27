"""gpuctl's modules as the tests see them: the headless list (read from pyproject.toml's
import-linter contract, the one place it is written) and the import graph (from the source, lazy
imports inside functions included)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIR = REPO_ROOT / "gpuctl"


def headless_modules() -> list[str]:
    """The headless modules of the contract "Headless core never imports textual", as written in
    pyproject.toml (packages stand for every module below them)."""
    doc = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    for contract in doc["tool"]["importlinter"]["contracts"]:
        if "textual" in contract.get("forbidden_modules", []):
            return list(contract["source_modules"])
    raise AssertionError("pyproject.toml has no import-linter contract forbidding textual")


def module_files() -> dict[str, Path]:
    """Every module of the gpuctl package: dotted name -> file (a package is its __init__.py)."""
    out = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def expand(names: list[str]) -> list[str]:
    """`names` with each package replaced by itself and every module below it (not its
    __main__, which runs when imported), sorted."""
    files = module_files()
    return sorted({m for name in names for m in files
                   if (m == name or m.startswith(name + ".")) and not m.endswith(".__main__")})


def import_graph() -> dict[str, set[str]]:
    """module -> the gpuctl modules it imports anywhere in its source (top level or inside a
    function). ``from pkg import name`` counts as importing pkg.name when that is a module, else pkg.
    An import of one's own ancestor package is not an edge: Python imports every ancestor before
    the module anyway, so that edge is in every module and says nothing (as in import-linter)."""
    files = module_files()
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        is_pkg = path.name == "__init__.py"
        package = name if is_pkg else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in files:  # `import gpuctl.x.y` of a name: the module holding it
                    t = t.rpartition(".")[0]
                if t and t != name and not name.startswith(t + "."):
                    deps.add(t)
        graph[name] = deps
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out
