"""Regenerate the README's results sections from the files under ``results/`` and ``policies/``.

    python -m experiments.readme

Each section sits between ``<!-- BEGIN:name -->`` and ``<!-- END:name -->`` markers; its text is
read from generated files only, so every number in the README comes from a command in the repo.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from agents.artefacts import write_text_atomic
from experiments.paper import STUDIES, gain_cells

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"


def _table(path: Path) -> str:
    """The first markdown table in a generated file."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


def paper_summary() -> str:
    rows = []
    for name, study in STUDIES.items():
        csv = RESULTS / f"{name}.csv"
        if not csv.exists() or name == "exhaustive" or name.startswith("robust"):
            continue
        df = pd.read_csv(csv)
        rounds = int(df.groupby(["value", "scheduler"]).size().min())
        row = {"study": name, "rounds/point": rounds}
        row.update({f"vs {b}": c for b, c in gain_cells(df, study).items()})
        row["paper"] = study.paper
        rows.append(row)
    return pd.DataFrame(rows).fillna("").to_markdown(index=False)


def robustness_summary() -> str:
    rows = []
    for name in ("robust_alpha", "robust_output", "robust_tail"):
        csv = RESULTS / f"{name}.csv"
        if not csv.exists():
            continue
        df = pd.read_csv(csv)
        frac = (df.served / df.num_users).groupby([df.value, df.scheduler]).mean().unstack()
        frac = frac.reindex([float(v) for v in STUDIES[name].values])
        clean, worst = frac.iloc[0], frac.iloc[-1]
        row = {"study": name, "condition": f"{frac.index[-1]}"}
        for s in frac.columns:
            row[f"{s} drop"] = f"{(clean[s] - worst[s]) / clean[s] * 100:.1f} %"
        row["paper"] = STUDIES[name].paper
        rows.append(row)
    return pd.DataFrame(rows).to_markdown(index=False)



def _between(path: Path, start: str, end: str | None = None) -> str:
    """The text of a generated file from the line that starts with ``start`` up to (not including)
    the line that starts with ``end`` (or the end of the file)."""
    lines = path.read_text().splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith(start))
    j = next((k for k in range(i + 1, len(lines)) if end and lines[k].startswith(end)), len(lines))
    return "\n".join(lines[i:j]).strip()


def specedge_hybrid() -> str:
    """BALANCE vs BALANCE-with-ED served users (paired), from experiments.specedge's hybrid summary."""
    df = pd.read_csv(RESULTS / "specedge" / "hybrid_summary.csv")
    out = pd.DataFrame({
        "K": df["num_users"], "edge fraction": df["edge_fraction"],
        "balance": df["balance_served"], "balance_ed": df["balance_ed_served"],
        "balance_ed − balance (95 % CI)": [f"{m:+.2f} [{lo:+.2f}, {hi:+.2f}]" for m, lo, hi in zip(df["balance_ed_minus_balance_mean"], df["balance_ed_minus_balance_ci_low"], df["balance_ed_minus_balance_ci_high"], strict=True)],
        "edge_first": df["edge_first_served"],
    })
    return out.to_markdown(index=False, floatfmt=".2f") + "\n\nUsers served per round, 50 test rounds per point, paired by round (bootstrap 95 % CI). Reproduce: `python -m experiments.specedge --out results/specedge`."

SECTIONS = {
    "headline": lambda: _table(RESULTS / "k.md"),
    "paper": paper_summary,
    "robustness": robustness_summary,
    "exhaustive": lambda: (RESULTS / "exhaustive.md").read_text().split("\n\n", 2)[2].split("\nPaper")[0].strip(),
    "calibration": lambda: (RESULTS / "calibration.md").read_text().split("Headline", 1)[1].split("\n")[0].join(["Headline", ""]),
    "env_speed": lambda: _table(RESULTS / "env_speed.md"),
    "learned": lambda: (RESULTS / "learned.md").read_text().strip(),
    "general": lambda: _body(RESULTS / "general.md"),
    "main_job": lambda: (RESULTS / "main_job.md").read_text().strip(),
    "sd_vs_ad": lambda: _table(RESULTS / "sd_vs_ad.md"),
    "balance_speed": lambda: _table(RESULTS / "balance_speed.md"),
    "sim_vs_real": lambda: _body(RESULTS / "sim_vs_real.md"),
    "sim_vs_real_cpu_hog": lambda: _body(RESULTS / "sim_vs_real_cpu_hog.md"),
    "sim_vs_real_fluid": lambda: _body(RESULTS / "sim_vs_real_sharing_work_conserving.md"),
    "overload": lambda: _body(RESULTS / "overload.md"),
    "pair": lambda: pair_summary(),
    "profile_fit": lambda: profile_fit(),
    "fidelity": lambda: fidelity_summary(),
    "optimality": lambda: _body(RESULTS / "optimality.md"),  # both tables (BALANCE; learned policies)
    "train_speed": lambda: _table_with(RESULTS / "train_speed.md", "Target", "Reproduce"),
    "mutation": lambda: _table_with(RESULTS / "mutation.md", "Produced by"),
    "coverage": lambda: _table_with(RESULTS / "coverage.md", "Produced by", "pytest exit"),
    "specedge": lambda: _between(RESULTS / "specedge" / "specedge.md", "## Against the published", "## Gain vs RTT").replace("## ", "#### "),
    "specedge_hybrid": specedge_hybrid,
    "des_check": lambda: _between(RESULTS / "specedge" / "des_check.md", "**", "## By draft").strip(),
    "learned_v1": lambda: _between(RESULTS / "learned_v1_400k" / "learned_v1.md", "K = 20", "## All schedulers").replace("## ", "#### "),
    "learned_v1_150k": lambda: _between(RESULTS / "learned_v1" / "learned_v1.md", "**Target", "## All"),
    "v1_speed": lambda: _table_with(RESULTS / "v1_speed.md", "Medians over", "- EdgeSchedule", "Host:"),
    "split_bench": lambda: "\n\n".join([_body(RESULTS / "split_bench" / "split_bench.md"), "The transport alone (gRPC on loopback against the in-process link, a verifier that answers at once):",
                                        (RESULTS / "split_bench" / "transport_timing.md").read_text().strip(),
                                        *(["The verifier against the SD engine's verify pass, CPU per emitted token in one process:",
                                           (RESULTS / "split_bench" / "verify_vs_engine.md").read_text().strip()]
                                          if (RESULTS / "split_bench" / "verify_vs_engine.md").exists() else [])]),
    "gpu_check": lambda: gpu_check_summary(),
    "depth_settle": lambda: depth_settle_summary(),
    "split_sim_vs_real": lambda: _body(RESULTS / "split_sim_vs_real" / "summary.md"),
    "tune": lambda: _body(RESULTS / "tune" / "summary.md"),
    "tune_compare": lambda: "\n\n".join(_body(p) for p in sorted((RESULTS / "tune").glob("compare*.md"))),
}


def _table_with(path: Path, *prefixes: str) -> str:
    """The first markdown table of a generated file, followed by its lines that start with ``prefixes``."""
    extra = [line for line in path.read_text().splitlines() if line.startswith(prefixes)]
    return "\n\n".join([_table(path), *extra])


def depth_settle_summary() -> str:
    """The live depth-controller runs (greedy; sampling at temperature 1 with the repeats re-drawing
    the same texts, then with new texts per repeat, for the default controller and the holding
    variant, then after the prefill fix): the target line and the by-RTT table of each."""
    parts = []
    for name, label in (("greedy", "Greedy decoding"),
                        ("temperature1", "Sampling at temperature 1, every repeat the same two texts"),
                        ("temperature1_texts", "Sampling at temperature 1, 24 texts per depth (`--seeds per-repeat`), the default controller"),
                        ("temperature1_texts_hold", "The same sweep and texts, the controller with `--depth-hold 0.01 --depth-memory 0.995`"),
                        ("temperature1_texts_after_fix", "The same command after the prefill fix, a new sweep and new runs of the default controller")):
        path = RESULTS / "depth_settle" / name / "depth_settle.md"
        target = next(line for line in path.read_text().splitlines() if line.startswith("**Target**"))
        parts += [f"{label} (`results/depth_settle/{name}`). {target}", _table(path)]
    return "\n\n".join(parts)


def gpu_check_summary() -> str:
    """The H200 check after the cuDNN fix: the verifier's per-shape timing table and the split's throughput line."""
    folder = RESULTS / "gpu_check" / "cudnn_off"
    target = [line for line in (folder / "split_bench.md").read_text().splitlines() if line.startswith("- split vs")]
    return "\n\n".join([(folder / "verify_timing.md").read_text().strip(), *target,
                        "Both runs, their commands and what changed between them: `results/gpu_check/README.md`."])


def fidelity_summary() -> str:
    """The fidelity study's candidate table and its best-match sentence."""
    path = RESULTS / "paper_fidelity.md"
    best = [line for line in path.read_text().splitlines() if line.startswith("Best match")]
    return "\n\n".join([_table(path), *best, "Reproduce: `python -m experiments.paper_fidelity --rounds 50 --seed 0` (details and per-K tables: `results/paper_fidelity.md`)."])


def pair_summary() -> str:
    import json

    meta = json.loads((RESULTS / "pair.json").read_text())
    r = meta["recipe"]
    rows = [
        {"model": "target", "params": meta["target_params"], "shape (hidden/layers/heads/kv)": "{hidden}/{layers}/{heads}/{kv_heads}".format(**r["target"]), "training": f"{meta['target_steps']} steps, {meta['train_seconds']['target']:.0f} s", "held-out bits/byte": meta["bits_per_byte"]["target"]},
        {"model": "draft", "params": meta["draft_params"], "shape (hidden/layers/heads/kv)": "{hidden}/{layers}/{heads}/{kv_heads}".format(**r["draft"]), "training": f"{meta['draft_steps']} steps, {meta['train_seconds']['draft']:.0f} s (distilled)", "held-out bits/byte": meta["bits_per_byte"]["draft"]},
    ]
    acc = meta["greedy_acceptance"]
    bound = f" Refused if held-out bits/byte exceed {r['max_target_bits_per_byte']} (target) / {r['max_draft_bits_per_byte']} (draft); recipe `{meta['recipe_digest']}`, {r['threads']} thread(s), torch {meta['torch']}, built in {meta['build_seconds']:.0f} s on a shared 2-core machine."
    return pd.DataFrame(rows).to_markdown(index=False, floatfmt=".3g") + f"\n\nGreedy acceptance (draft argmax = target argmax along the target's continuation, 64 tokens per prompt): code {acc['code']:.3f}, prose {acc['prose']:.3f}. Corpus: {meta['train_bytes'] / 1e6:.1f} MB of standard-library source, {meta['held_out_bytes'] / 1e6:.2f} MB held out." + bound


def _body(path: Path) -> str:
    """A results file without its title line."""
    return path.read_text().split("\n", 1)[1].strip()


MEASURED_PROFILES = ("cpu_specsched-pair", "cpu1_specsched-pair")


def profile_fit() -> str:
    import yaml

    rows, engine, notes = [], [], []
    for profile in MEASURED_PROFILES:
        prof = yaml.safe_load((ROOT / "envs" / "profiles" / f"{profile}.yaml").read_text())
        for key, name in (("llm", "target"), ("slm", "draft")):
            f = prof["fit"][key]
            t = prof["latency"][key]
            rows.append({"profile": profile, "model": name, "grid (b x q x c)": f"{len(t['b'])} x {len(t['q'])} x {len(t['c'])}", "tau(1,1,64) ms": np.asarray(t["tau_s"])[0, 0, 1] * 1e3,
                         "a (ms)": f["intercept_s"] * 1e3, "implied FLOP/s": f["implied_flop_s"], "s per byte": f["per_byte_s"],
                         "median error": f"{f['median_rel_error'] * 100:.1f} %", "max error": f"{f['max_rel_error'] * 100:.1f} %"})
        e = prof.get("engine")
        if e:
            for i, b in enumerate(e["b"]):
                engine.append({"profile": profile, "b": b, "AD step (ms)": e["ad_step_s"][i] * 1e3, "SD iteration (ms)": e["sd_iteration_s"][i] * 1e3, "+ per draft step (ms)": e["sd_draft_step_s"][i] * 1e3})
        notes.append(f"`{profile}`: {prof['device']['name']}; {prof['notes']}.")
    text = pd.DataFrame(rows).to_markdown(index=False, floatfmt=".3g") + "\n\n" + "\n".join(f"- {n}" for n in notes)
    if engine:
        text += "\n\nEngine overhead beyond the bare passes (`engine` section; the cost model adds it per AD step and per SD iteration):\n\n"
        text += pd.DataFrame(engine).to_markdown(index=False, floatfmt=".2f")
    return text


HEADING = re.compile(r"^(#{1,6}) ")


def _headings(text: str) -> list[tuple[int, int]]:
    """``(line index, level)`` of the markdown headings of ``text``, code fences skipped (a ``# ...``
    comment in a bash block is not a heading)."""
    out, fenced = [], False
    for i, line in enumerate(text.split("\n")):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := HEADING.match(line)):
            out.append((i, len(m.group(1))))
    return out


def nest(body: str, level: int) -> str:
    """``body`` with its headings moved below a heading of ``level`` (their relative depths kept,
    at most 6): a generated file's ``# Title`` / ``## Part`` must not open sections of the README."""
    found = _headings(body)
    if not found:
        return body
    shift = max(0, level + 1 - min(lv for _, lv in found))
    lines = body.split("\n")
    for i, lv in found:
        lines[i] = "#" * min(6, lv + shift) + lines[i][lv:]
    return "\n".join(lines)


def fill_sections(text: str, sections: dict) -> str:
    """``text`` with every ``<!-- BEGIN:name -->`` ... ``<!-- END:name -->`` body replaced by
    ``sections[name]()``, its headings nested under the README heading the section sits in."""
    for name, make in sections.items():
        # the body between the markers may be empty (a fresh section: BEGIN on the line before END)
        pattern = re.compile(rf"(<!-- BEGIN:{name} -->\n)(?:.*?\n)?(<!-- END:{name} -->)", re.S)
        found = pattern.search(text)
        if not found:
            continue
        try:
            body = make()
        except (FileNotFoundError, StopIteration, KeyError, IndexError) as err:
            body = f"(not generated yet: {err})"
        # the README's own headings above the section (other sections' generated headings left out)
        above = _headings(re.sub(r"<!-- BEGIN:([\w-]+) -->\n.*?<!-- END:\1 -->", "", text[: found.start()], flags=re.S))
        body = nest(body, above[-1][1] if above else 0)
        text = pattern.sub(lambda m, b=body: m.group(1) + b + "\n" + m.group(2), text)
    return text


def main(argv: list[str] | None = None) -> None:
    import argparse

    argparse.ArgumentParser(prog="python -m experiments.readme", description=__doc__.split("\n\n")[0]).parse_args(argv)  # --help: no rewrite
    readme = ROOT / "README.md"
    write_text_atomic(readme, fill_sections(readme.read_text(), SECTIONS))  # a reader never sees half a README
    print(f"updated {readme}")


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
