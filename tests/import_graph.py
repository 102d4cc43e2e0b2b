"""The repository's import graph, checked: layers point one way, no cycles, no private names.

Run it to see the graph: ``python tests/import_graph.py`` (prints each module's imports of
other repository modules, then any violation; exits 1 if there is one). ``tests/test_layout.py``
runs the same checks.

Layers (a module may import its own package and any lower layer, never a higher one):

    reproductions                              (the run, commands, sweeps, reports, benchmarks)
    lightning_modules  datamodules  analysis   (training logic, data I/O, probes: peers, independent)
    models                                     (plain nn.Modules)
    utils                                      (atomic file writes, the closed-choice check, GAUC, ...)

Inside ``reproductions`` the rooms are layered the same way (``ROOMS``):

    __main__                                   (dispatches ``repro <command>``)
    commands                                   (one module per command)
    sweeping  benchmarks                       (the sweep engine; the benchmarks: peers)
    run                                        (one run's lifecycle: CLI, run directory, results, W&B)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("utils", "models", "lightning_modules", "datamodules", "analysis", "reproductions")
#: which top-level packages each package may import (besides itself)
ALLOWED = {
    "utils": set(),
    "models": {"utils"},
    "lightning_modules": {"models", "utils"},
    "datamodules": {"models", "utils"},
    "analysis": {"models", "utils"},
    "reproductions": {"models", "utils", "lightning_modules", "datamodules", "analysis"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def repo_modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            out[module_name(path)] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The repository module ``name`` refers to (a module, or the package holding the name)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imports(path: Path, modules: dict[str, Path]) -> list[tuple[str, list[str]]]:
    """``(module imported, names taken from it)`` for every import of a repository module in ``path``
    (function-level imports included: they are dependencies too)."""
    me = module_name(path)
    is_package = path.name == "__init__.py"
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(alias.name, modules)
                if target:
                    out.append((target, []))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = me.split(".") if is_package else me.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            for alias in node.names:
                sub = _resolve(f"{name}.{alias.name}", modules)
                if sub == f"{name}.{alias.name}":  # `from pkg import submodule`
                    out.append((sub, []))
                else:
                    target = _resolve(name, modules)
                    if target:
                        out.append((target, [alias.name]))
    return out


def graph() -> dict[str, dict[str, list[str]]]:
    modules = repo_modules()
    g: dict[str, dict[str, list[str]]] = {}
    for name, path in modules.items():
        edges: dict[str, list[str]] = {}
        for target, names in imports(path, modules):
            if target != name:
                edges.setdefault(target, []).extend(names)
        g[name] = edges
    return g


def cycles(g: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in g.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def _is_package_of(importer: str, target: str) -> bool:
    """``target`` is the importer's own package (``__init__``) or one of its parents."""
    return importer.startswith(target + ".")


#: the rooms of ``reproductions`` and which rooms each may import (besides itself)
ROOMS = {
    "run": set(),
    "sweeping": {"run"},
    "benchmarks": {"run"},
    "commands": {"run", "sweeping", "benchmarks"},
    "__main__": {"run", "commands"},
}


def room(module: str) -> str | None:
    """The room of ``reproductions`` a module lies in (None: not in ``reproductions``, or the package itself)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "reproductions" and len(parts) > 1 else None


def layer_violations(g) -> list[str]:
    out = []
    for src, edges in sorted(g.items()):
        top = src.split(".")[0]
        for dst in edges:
            other = dst.split(".")[0]
            if other != top and other not in ALLOWED[top]:
                out.append(f"{src} imports {dst}: {top} may import only {sorted(ALLOWED[top]) or 'nothing of ours'}")
            here, there = room(src), room(dst)
            if top == other == "reproductions" and here != there and there not in ROOMS.get(here, set()):
                allowed = sorted(ROOMS.get(here, set())) or "no other room"
                out.append(f"{src} imports {dst}: reproductions.{here} may import only {allowed}")
    return out


def loose_modules() -> list[str]:
    """Modules of ``reproductions`` outside its rooms (paper folders hold configs and Markdown only)."""
    return sorted(m for m in repo_modules() if m.startswith("reproductions.") and room(m) not in ROOMS)


def private_imports(g) -> list[str]:
    """Names starting with ``_`` taken from another module (a package's ``__init__`` re-exporting
    from its own submodules is fine; dunder names too)."""
    out = []
    for src, edges in sorted(g.items()):
        for dst, names in edges.items():
            for n in names:
                if n.startswith("_") and not n.startswith("__") and not _is_package_of(dst, src):
                    out.append(f"{src} imports the private name {n} from {dst}")
    return out


def main() -> int:
    g = graph()
    for src, edges in sorted(g.items()):
        if edges:
            print(f"{src} -> {', '.join(sorted(edges))}")
    problems = [f"cycle: {' <-> '.join(c)}" for c in cycles(g)] + layer_violations(g) + private_imports(g)
    print()
    print("\n".join(problems) if problems else f"{len(g)} modules: no cycles, layers one way, no private imports")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
