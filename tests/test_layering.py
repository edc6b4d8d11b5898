"""The one-way data flow of DESIGN.md, checked on the source: no import circles, no upward imports.

Every ``import`` statement counts, also those inside functions (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("envs", "agents", "runtime", "experiments")


def project_modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


MODULES = project_modules()


def imports_of(name: str, path: Path) -> set[str]:
    """Project modules ``name`` imports (``from a.b import c`` counts as ``a.b.c`` if that is a module, else ``a.b``)."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in MODULES:  # a name inside a module: the module itself
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


GRAPH = {name: imports_of(name, path) for name, path in MODULES.items()}


def _layer(module: str) -> str:
    return module.split(".")[0]


@pytest.mark.parametrize(("lower", "upper"), [("envs", "agents"), ("envs", "runtime"), ("envs", "experiments"),
                                              ("agents", "runtime"), ("agents", "experiments")])
def test_no_module_imports_an_upper_layer(lower, upper):
    bad = sorted(f"{m} -> {t}" for m, targets in GRAPH.items() if _layer(m) == lower for t in targets if _layer(t) == upper)
    assert not bad, f"{lower}/ must not import {upper}/ (DESIGN.md: one-way data flow): {bad}"


#: circles known and left to their owners (each is a pair of function-level imports); remove an
#: entry when it is broken. runtime.profile's CLI reads role sections from runtime.split.role_profile,
#: which times passes with runtime.profile's helpers.
KNOWN_CIRCLES = [{"runtime.profile", "runtime.split.role_profile"}]


def _cycle(known: list[set[str]] = ()) -> list[str] | None:
    """One import cycle between project modules (package ``__init__`` edges and ``known`` circles'
    edges left out), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for t in sorted(GRAPH.get(m, ())):
            if t in PACKAGES:  # importing a package's __init__ (e.g. envs registers the gym ids) is not a module edge
                continue
            if any({m, t} <= circle for circle in known):
                continue
            if state.get(t) == 1:
                return stack[stack.index(t):] + [t]
            if t not in state and (found := visit(t)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(GRAPH):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_circles():
    cycle = _cycle(KNOWN_CIRCLES)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_planted_circle(monkeypatch):
    """The check above can fail: a planted agents.export <-> agents.policy edge is reported."""
    planted = {**GRAPH, "agents.policy": GRAPH["agents.policy"] | {"agents.export"}, "agents.export": GRAPH["agents.export"] | {"agents.policy"}}
    monkeypatch.setitem(globals(), "GRAPH", planted)
    cycle = _cycle(KNOWN_CIRCLES)
    assert cycle is not None and {"agents.policy", "agents.export"} <= set(cycle)
    assert _cycle() is not None  # the known circles are found when not excused


def test_the_load_generator_does_not_import_the_evaluation_app():
    assert "agents.evaluate" not in GRAPH["runtime.loadgen"]
    importers = sorted(m for m, targets in GRAPH.items() if "agents.evaluate" in targets)
    assert all(not m.startswith("runtime.") for m in importers), importers


def _import_in_fresh_interpreter(names: list[str]) -> subprocess.CompletedProcess:
    code = "import importlib, sys\nfor n in sys.argv[1:]:\n    importlib.import_module(n)\n"
    return subprocess.run([sys.executable, "-c", code, *names], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_modules_import_in_either_order():
    """Everything imports in one fresh interpreter, in reverse order (leaves first: an order that
    enters a circle from its far end), and the export/policy pair in both orders."""
    for names in (sorted(MODULES, reverse=True), ["agents.export", "agents.policy"], ["agents.policy", "agents.export"]):
        res = _import_in_fresh_interpreter(names)
        assert res.returncode == 0, res.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODULES))
def test_each_module_imports_alone(name):
    res = _import_in_fresh_interpreter([name])
    assert res.returncode == 0, res.stderr[-3000:]
