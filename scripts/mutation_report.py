"""Write the mutation-testing report (markdown) from a finished ``mutmut run``.

``--workdirs`` are the folders mutmut ran in (each holding ``mutants/``)::

    python scripts/mutation_report.py --workdirs /tmp/m/envs /tmp/m/agents --equivalents scripts/mutation_equivalents.tsv \
        --targets 'envs.cost_model.*' 'envs.feasibility.*' 'envs.plan_builder.*' 'envs.outcome.*' --command 'bash scripts/mutation.sh' --out results/mutation.md

Score = killed / (mutants run - equivalent), where killed includes timeouts and crashes (the test
run did not pass). An equivalent mutant is one no test can kill because the program's behaviour is
unchanged; each is listed in the equivalents file (tab separated: mutant name, the mutated line as
``mutmut show`` prints it after ``+``, why it is equivalent). An entry whose line no longer matches
the mutant is reported as stale and the mutant counts as survived.
"""

from __future__ import annotations

import argparse
import fnmatch
import re
import subprocess
import sys
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agents.artefacts import write_text_atomic

KILLED = {"killed", "timeout", "segfault", "suspicious"}  # the tests did not pass on the mutant
NOT_RUN = {"not checked", "skipped"}


def mutmut(workdir: Path, *args: str) -> str:
    exe = Path(sys.executable).with_name("mutmut")
    return subprocess.run([str(exe), *args], check=True, capture_output=True, text=True, cwd=workdir).stdout


def statuses(workdir: Path) -> dict[str, str]:
    out = {}
    for line in mutmut(workdir, "results", "--all", "true").splitlines():
        m = re.match(r"\s*(\S+): (.+)$", line)
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def diff_lines(workdir: Path, name: str) -> tuple[str, str]:
    """The original and the mutated line of a mutant (first ``-`` / ``+`` lines of its diff)."""
    minus = plus = ""
    for line in mutmut(workdir, "show", name).splitlines():
        if line.startswith("-") and not line.startswith("---") and not minus:
            minus = line[1:].strip()
        elif line.startswith("+") and not line.startswith("+++") and not plus:
            plus = line[1:].strip()
    return minus, plus


def load_equivalents(path: Path) -> dict[str, tuple[str, str]]:
    eq = {}
    if path.is_file():
        for raw in path.read_text().splitlines():
            if not raw.strip() or raw.startswith("#"):
                continue
            name, line, why = raw.split("\t", 2)
            eq[name.strip()] = (line.strip(), why.strip())
    return eq


def cell(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return text.replace("|", "\\|")


def module_of(name: str) -> str:
    return name.split(".x", 1)[0] if ".x" in name else name.rsplit(".", 1)[0]


def function_of(name: str) -> str:
    tail = name.split(".x", 1)[1] if ".x" in name else name
    return re.sub(r"__mutmut_\d+$", "", tail).replace("ǁ", ".").strip("_.")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--equivalents", type=Path, required=True)
    ap.add_argument("--workdirs", nargs="+", type=Path, default=[Path(".")], help="folders mutmut ran in (each holds mutants/)")
    ap.add_argument("--targets", nargs="+", required=True, help="mutant name globs that were run")
    ap.add_argument("--command", required=True, help="the command that produced the run (for the report)")
    ap.add_argument("--history", default="", help="how the groups' runs came about (earlier runs, reruns), appended to the report's first line")
    ap.add_argument("--groups", nargs="*", default=[], help="extra rows: LABEL=GLOB[,GLOB...] (e.g. action handling)")
    ap.add_argument("--carry-killed", nargs="*", type=Path, default=[],
                    help="workdirs whose 'not checked' mutants count as killed: a survivors-only rerun (MUTATION_RERUN=survivors) "
                         "after new tests leaves every other mutant unmarked, and those were killed by the group's last full run "
                         "(valid only while its modules are unchanged since; tests were only added)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    st, where, carried = {}, {}, 0
    carry = {wd.resolve() for wd in args.carry_killed}
    for wd in args.workdirs:
        for k, v in statuses(wd).items():
            if any(fnmatch.fnmatch(k, t) for t in args.targets):
                if v == "not checked" and wd.resolve() in carry:
                    v, carried = "killed", carried + 1
                st[k], where[k] = v, wd
    eq = load_equivalents(args.equivalents)
    rows: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    survivors, equivalents, stale, not_run = [], [], [], []
    # one `mutmut show` per surviving mutant, each a Python start-up: run them side by side
    alive = sorted(k for k, v in st.items() if v not in NOT_RUN and v not in KILLED)
    with ThreadPoolExecutor(max_workers=4) as pool:
        diffs = dict(zip(alive, pool.map(lambda n: diff_lines(where[n], n), alive), strict=True))
    for name, status in sorted(st.items()):
        groups = [module_of(name)] + [g.split("=", 1)[0] for g in args.groups if any(fnmatch.fnmatch(name, p) for p in g.split("=", 1)[1].split(","))]
        if status in NOT_RUN:
            not_run.append(name)
            continue
        kind = "killed" if status in KILLED else "survived"
        if kind == "survived":
            minus, plus = diffs[name]
            if name in eq and eq[name][0] == plus:
                kind = "equivalent"
                equivalents.append((name, minus, plus, eq[name][1]))
            else:
                if name in eq:
                    stale.append(name)
                survivors.append((name, status, minus, plus))
        for g in groups:
            rows[g][kind] += 1

    def score(r: dict[str, int]) -> str:
        denom = r["killed"] + r["survived"]
        return f"{100.0 * r['killed'] / denom:.1f} %" if denom else "n/a"

    total = defaultdict(int)
    for g, r in rows.items():
        if not any(g == x.split("=", 1)[0] for x in args.groups):
            for k, v in r.items():
                total[k] += v
    lines = [
        "# Mutation testing of the core modules",
        "",
        f"Produced by `{args.command}` (mutmut, config in `setup.cfg` `[mutmut]`)" + (f" {args.history.strip()}" if args.history.strip() else "."),
        "Score = killed / (mutants - equivalent); a timeout or crash counts as killed. Equivalent",
        "mutants (no behaviour change, so no test can kill them) are listed below with the reason.",
        "",
        "| module / group | mutants | killed | survived | equivalent | score |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for g in sorted(rows):
        r = rows[g]
        lines.append(f"| {g} | {r['killed'] + r['survived'] + r['equivalent']} | {r['killed']} | {r['survived']} | {r['equivalent']} | {score(r)} |")
    lines.append(f"| **all modules** | {total['killed'] + total['survived'] + total['equivalent']} | {total['killed']} | {total['survived']} | {total['equivalent']} | **{score(total)}** |")
    if carried:
        lines += ["", f"{carried} mutants of the {', '.join(w.name for w in args.carry_killed)} group count as killed from its last "
                  "full run: the survivors-only rerun after new tests left them unchecked (`--carry-killed`)."]
    if not_run:
        lines += ["", f"{len(not_run)} mutants were not run (no test reaches them or the run was cut short): " + ", ".join(f"`{n}`" for n in not_run[:40]) + (" ..." if len(not_run) > 40 else "")]
    lines += ["", "## Surviving mutants", ""]
    if survivors:
        lines += ["| mutant | status | original | mutated |", "|---|---|---|---|"]
        lines += [f"| `{n}` | {s} | `{cell(m)}` | `{cell(p)}` |" for n, s, m, p in survivors]
    else:
        lines.append("None.")
    if stale:
        lines += ["", "Stale equivalence entries (the mutant's line changed; re-examine): " + ", ".join(f"`{n}`" for n in stale)]
    lines += ["", "## Equivalent mutants", ""]
    if equivalents:
        lines += ["| mutant | mutated | why no test can kill it |", "|---|---|---|"]
        lines += [f"| `{n}` | `{cell(p)}` | {cell(why)} |" for n, _, p, why in equivalents]
    else:
        lines.append("None.")
    text = "\n".join(lines) + "\n"
    write_text_atomic(args.out, text)
    print(f"wrote {args.out}: {score(total)} over {sum(total.values())} mutants")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
