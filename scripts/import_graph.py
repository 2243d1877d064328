"""The project's import graph: which package imports which, and the two rules it must keep.

1. No cycle between modules (imports inside functions count: a lazy import is still a dependency).
2. No upward import: a package imports only packages of a lower layer (``LAYERS``) or itself.

``python scripts/import_graph.py`` prints each package's module count and its imports of the
others, then every violation; it exits 1 when there is one. ``tests/test_import_graph.py`` runs it.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LAYERS: dict[str, int] = {
    "optimizer": 0,  # the engine: problem model, costs, heuristic, bounds, plan, verification
    "solver_models": 1,  # exact backends: read cost tables, return assignments
    "planning": 2,  # orchestration: the only layer that knows the engine and the solvers
    "jobs": 3,  # epoch planning jobs
    "api.store": 4,  # the plan store: tables, migrations, queries
    "api.client": 4,  # the trainers' client (httpx; the engine only to plan locally)
    "api.service": 5,  # the HTTP service: routes, admission, intake, the plan cache, settings
    "api.dashboard": 6,  # the solver tuning dashboard: its routes, views and pages
    "api": 7,  # the application that joins the service and the dashboard, and a local server of it
    "trainer": 8,  # applies plans on the training ranks (gets them through the client, or plans locally)
    "bench": 9,  # benchmarks and baselines (they drive the service, the trainer and its framework integrations)
    "api.cli": 10,  # the ``dhp`` command line: the top, it may import every other part
}
"""A part may import parts of a lower layer, never of its own layer (other than itself) or above.

A part is a top-level package or, where listed, a subpackage; a module belongs to the longest part
that names a prefix of it (``api.service.intake`` to ``api.service``, ``api.app`` to ``api``).
"""


def part(module: str) -> str:
    """The part (a key of ``LAYERS``) a module belongs to."""
    name = module
    while name not in LAYERS:
        if "." not in name:
            raise KeyError(f"{module} belongs to no part of LAYERS")
        name = name.rpartition(".")[0]
    return name


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the project's packages by dotted name."""
    out: dict[str, Path] = {}
    for package in sorted({p.split(".")[0] for p in LAYERS}):
        base = root / package
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            if "migrations" in path.parts:
                continue
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest project module that ``name`` names (a symbol imported from a module resolves to the module)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def imports(known: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> project modules it imports (anywhere in its body)."""
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        is_package = path.name == "__init__.py"
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [f"{mod}.{alias.name}" for alias in node.names] + [mod]
            for target in targets:
                hit = _resolve(target, known)
                if hit is not None and hit != name:
                    deps.add(hit)
                    break
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Imports that break the layer rule, as 'a -> b' lines."""
    bad = []
    for a, deps in sorted(graph.items()):
        pa = part(a)
        for b in sorted(deps):
            pb = part(b)
            if pa != pb and LAYERS[pb] >= LAYERS[pa]:
                bad.append(f"{a} -> {b} ({pa} is layer {LAYERS[pa]}, {pb} is layer {LAYERS[pb]})")
    return bad


def report(root: Path = ROOT) -> tuple[list[str], list[str]]:
    """(lines to print, violations)."""
    known = modules(root)
    graph = imports(known)
    lines = ["package          layer  modules  imports"]
    for package, layer in sorted(LAYERS.items(), key=lambda kv: (kv[1], kv[0])):
        mods = [m for m in known if part(m) == package]
        if not mods:
            continue
        uses = sorted({part(d) for m in mods for d in graph[m]} - {package})
        lines.append(f"{package:<16} {layer:>5}  {len(mods):>7}  {', '.join(uses) or '-'}")
        subs: dict[str, int] = defaultdict(int)
        for m in mods:
            parts = m.split(".")
            if len(parts) > len(package.split(".")) + 1:
                subs[".".join(parts[: len(package.split(".")) + 1])] += 1
        for sub, count in sorted(subs.items()):
            lines.append(f"  {sub:<28} {count:>3} modules")
    violations = [f"cycle: {' <-> '.join(c)}" for c in cycles(graph)] + [f"upward: {u}" for u in upward(graph)]
    return lines, violations


def main() -> int:
    lines, violations = report()
    print("\n".join(lines))
    if violations:
        print(f"\n{len(violations)} violation(s):")
        print("\n".join(violations))
        return 1
    print("\nno cycle, no upward import")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
