"""Every public function of the packages has type hints (the project's rule for public APIs): a
module-level function or a method of a public class whose name has no leading underscore annotates
each parameter (``self``/``cls`` aside) and its return. Read from the source (AST), so the check
costs nothing at import time and names the offenders."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("envs", "agents", "runtime")


def _public_functions(tree: ast.Module):
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node, False
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield item, True


def unannotated(source: str) -> list[str]:
    """``name:line`` of each public function in ``source`` missing a parameter or return annotation."""
    out = []
    for fn, is_method in _public_functions(ast.parse(source)):
        if fn.name.startswith("_"):
            continue
        a = fn.args
        params = a.posonlyargs + a.args
        static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)
        if is_method and not static and params:
            params = params[1:]  # self / cls
        params = params + a.kwonlyargs + [p for p in (a.vararg, a.kwarg) if p is not None]
        if fn.returns is None or any(p.annotation is None for p in params):
            out.append(f"{fn.name}:{fn.lineno}")
    return out


def test_the_check_sees_a_missing_hint():
    src = "def f(x: int) -> int: ...\ndef g(x) -> int: ...\nclass C:\n    def m(self, y: int): ...\n    @staticmethod\n    def s(z: int) -> None: ...\n    def _p(self, q): ...\n"
    assert unannotated(src) == ["g:2", "m:4"]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_function_is_annotated(package):
    missing = {str(f.relative_to(ROOT)): bad for f in sorted((ROOT / package).rglob("*.py")) if (bad := unannotated(f.read_text()))}
    assert not missing, f"public functions without type hints: {missing}"
