"""The layout rules of docs/architecture.md, checked on the source: no import cycles between the
project's modules, and the process environment read in two modules only."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "engine", "speculative", "benchmarks", "server")
ENV_READERS = {"engine/options.py", "engine/paths.py"}


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = f
    return mods


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports, at module level or inside functions alike (an
    import deferred into a function still ties the two modules together)."""
    mods = _modules()
    graph = {m: set() for m in mods}
    for mod, f in mods.items():
        package = mod.split(".") if f.name == "__init__.py" else mod.split(".")[:-1]
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
                subs = [f"{base}.{a.name}" for a in node.names]
                targets = [s for s in subs if s in mods] or [base]
            else:
                continue
            graph[mod].update(t for t in targets if t in mods and t != mod)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]; counter[0] += 1
        stack.append(start); on_stack.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter[0]; counter[0] += 1
                    stack.append(w); on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop(); on_stack.discard(w); component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_environment_read_in_options_and_paths_only():
    readers = sorted(str(f.relative_to(ROOT)) for pkg in ("app", "engine", "speculative", "server")
                     for f in (ROOT / pkg).rglob("*.py") if re.search(r"\bos\.environ\b|\bgetenv\(", f.read_text()))
    assert set(readers) <= ENV_READERS, readers
