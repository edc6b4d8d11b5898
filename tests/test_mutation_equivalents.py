"""The hand-reviewed list of equivalent mutants (``scripts/mutation_equivalents.tsv``) stays well formed.

``scripts/mutation_report.py`` subtracts every entry from a module's mutants, so a malformed or
duplicated line would silently change a published score: each entry must have a mutant name of a
group that ``scripts/mutation.sh`` runs, the mutated line and a reason, and appear once.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TSV = ROOT / "scripts" / "mutation_equivalents.tsv"


def _report_module():
    spec = importlib.util.spec_from_file_location("mutation_report", ROOT / "scripts" / "mutation_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _group_globs() -> list[str]:
    """Every mutant-name glob of the groups in scripts/mutation.sh (its GLOBS[...] lines)."""
    text = (ROOT / "scripts" / "mutation.sh").read_text()
    return [g for line in re.findall(r'^GLOBS\[\w+\]="([^"]+)"', text, flags=re.M) for g in line.split()]


def test_every_entry_has_a_name_of_a_group_a_mutated_line_and_a_reason():
    globs = _group_globs()
    assert {"envs.cost_model.*", "agents.balance.*", "envs.split_cost.*", "agents.balance_ed.*"} <= set(globs)
    names = []
    for n, raw in enumerate(TSV.read_text().splitlines(), 1):
        if not raw.strip() or raw.startswith("#"):
            continue
        fields = raw.split("\t")
        assert len(fields) == 3, f"line {n}: expected NAME<TAB>mutated line<TAB>reason, got {len(fields)} field(s)"
        name, line, why = (f.strip() for f in fields)
        assert re.fullmatch(r"[\w.ǁ]+__mutmut_\d+", name), f"line {n}: {name!r} is not a mutmut mutant name"
        assert any(fnmatch.fnmatch(name, g) for g in globs), f"line {n}: {name} is in no group of scripts/mutation.sh"
        assert line and len(why) > 10, f"line {n}: the mutated line and a reason are both needed"
        names.append(name)
    dupes = sorted({x for x in names if names.count(x) > 1})
    assert not dupes, f"listed twice: {dupes}"
    assert len(_report_module().load_equivalents(TSV)) == len(names)  # what the report reads is every entry
