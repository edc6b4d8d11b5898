"""The report of ``experiments.sim_vs_real``: real vs simulated, per scheduler and per mode, as CSV + markdown.

:func:`compare` and :func:`compare_by_mode` reduce the merged real and simulated rows to served
counts and p50 latencies (compute split into prefill and decoding, so a gap's source shows);
:func:`write_report` writes the CSV, the profile planned with and the markdown, named by the
setting (CPU hog, a non-default sharing model) so a variant never overwrites the default's report.

Separate from the measurement (:mod:`experiments.sim_vs_real`) and the simulator side
(:mod:`experiments.sim_vs_real_simulate`): it reads rows, runs nothing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from agents.artefacts import write_csv_atomic, write_text_atomic
from experiments.sim_vs_real_simulate import DEFAULT_SHARING
from runtime.machine_profile import AUTO, PlanningProfile

ROOT = Path(__file__).resolve().parent.parent  #: the repository (paths in the report are shown relative to it)



def profile_lines(planning: PlanningProfile) -> list[str]:
    """Which profile and calibration the run planned with, for the report."""
    s = planning.summary()

    def short(path: str) -> str:  # repository-relative, or ~ for the home folder's cache
        return path.replace(str(ROOT) + "/", "").replace(str(Path.home()), "~")

    return [f"- profile: `{short(s['profile'])}` ({s['source']}; base `{short(s['base'])}`; this machine's key `{s['machine key']}`)",
            f"- this machine: {s['this machine']}", f"- table measured on: {s['table measured on']}", f"- calibration measured on: {s['calibration measured on']}",
            f"- calibration (measured / table pass time, per model and new tokens q): {s['calibration']}",
            f"- engine overhead (engine wall time beyond the calibrated passes): {s['engine overhead']}"]


def write_report(args, planning: PlanningProfile, df: pd.DataFrame, table: pd.DataFrame, modes: pd.DataFrame) -> None:
    # another simulator sharing model than the default writes beside the default's report, not over it
    stem = ("sim_vs_real_cpu_hog" if args.cpu_hog else "sim_vs_real") + ("" if args.sharing == DEFAULT_SHARING else f"_sharing_{args.sharing}")
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv_atomic(df, args.out / f"{stem}.csv")  # a reader never sees half a table
    if args.from_csv is None:  # the profile both sides planned with, beside the CSV: --from-csv can re-simulate it later
        write_text_atomic(args.out / f"{stem}_profile.yaml", Path(planning.path).read_text())
    cmd = f"python -m experiments.sim_vs_real --schedulers {args.schedulers} --rounds {args.rounds} --users {args.users}" + (f" --devices {args.devices}" if args.devices else "")
    cmd += (f" --profile {args.profile}" if args.profile != AUTO else "") + ("" if args.auto_profile else " --no-auto-profile")
    cmd += (" --cpu-hog" if args.cpu_hog else "") + (" --pair PATH" if args.pair else "")
    cmd += ("" if args.sharing == DEFAULT_SHARING else f" --sharing {args.sharing}") + ("" if args.completion == "own" else f" --completion {args.completion}")
    if args.from_csv is not None:
        cmd += f" --from-csv {args.from_csv}"
    setting = ("one CPU-bound process (a busy loop) ran beside the server throughout; each scheduler ran with the server's online calibration on "
               "(the simulator plans and costs with the per-mode factors the server ended with: columns *factor*) and off (both plan with the bare profile). "
               if args.cpu_hog else "the server's online calibration pinned at 1 (it plans with the bare profile, as the simulator does). ")
    text = "\n".join([
        "# Simulated vs real" + (" with a CPU hog" if args.cpu_hog else ""), "",
        *([f"Re-simulated from the real rows of `{args.from_csv}` (no server ran for this report).", ""] if args.from_csv is not None else []),
        f"{args.rounds} rounds x {args.users} requests per scheduler, deadlines x {args.time_scale}, outputs x {args.token_scale}, round window {args.window_s} s; "
        f"the project's pair on this CPU, server with {args.threads} torch thread(s){f' per device, devices {args.devices}' if args.devices else ''}; {setting}"
        f"Simulator outcome: completion `{args.completion}`, sharing `{args.sharing}`. "
        "Latency is from the request's arrival to its last token (the round window included). "
        "*sim* realises the acceptance estimate the server planned with (what the environment predicts); *sim, measured acceptance* realises each SD request's measured acceptance.", "",
        "Server and simulator planned with:", "", *profile_lines(planning), "",
        table.to_markdown(index=False, floatfmt=".3g"), "",
        "By mode (requests that ran in that mode in both). Compute = latency - wait - planning (real), latency - window (simulated); "
        "prefill = time to the first token - wait - planning (real), the batch's first engine step on the whole device (simulated: AD its prefill, SD both prefills and one iteration; the executor runs a step whole); decode = compute - prefill:", "",
        modes.to_markdown(index=False, floatfmt=".3g"), "",
        f"Reproduce: `{cmd}`" + ("" if args.from_csv is not None else f" (the profile it planned with is saved as `{stem}_profile.yaml`"
                                  + (")" if args.cpu_hog else f"; re-simulate this run with `--from-csv {stem}.csv --profile {stem}_profile.yaml`)")), "",
    ])
    write_text_atomic(args.out / f"{stem}.md", text)
    print(text)


def compare(both: pd.DataFrame, name: str, window_s: float) -> dict:
    """Served count and p50 latency, real vs simulated, for one scheduler (and its compute p50 error per mode)."""
    done = both.outcome.isin(["served", "late"])
    real_served = int((both.outcome == "served").sum())
    real_p50 = both.latency_s[done].median()
    row = {"scheduler": name, "requests": len(both), "served (real)": real_served}
    for label, col in (("sim", "sim"), ("sim, measured acceptance", "sim_measured")):
        served = int(both[f"{col}_served"].sum())
        row[f"served ({label})"] = served
        row[f"served error % ({label})"] = (served - real_served) / max(real_served, 1) * 100
    row["late (real)"] = int((both.outcome == "late").sum())
    row["p50 latency real (s)"] = real_p50
    for label, col in (("sim", "sim"), ("sim, measured acceptance", "sim_measured")):
        p50 = both[f"{col}_latency_s"].dropna().median()
        row[f"p50 ({label}) (s)"] = p50
        row[f"p50 error % ({label})"] = (p50 - real_p50) / real_p50 * 100 if real_p50 else np.nan
    row["same modes (%)"] = float((both["mode"].fillna("-") == both.sim_mode).mean() * 100)
    for mode_row in compare_by_mode(both, name, window_s):  # where a latency gap comes from
        row[f"{mode_row['mode'].upper()} compute p50 error %"] = mode_row["error %"]
    return row


def compare_by_mode(both: pd.DataFrame, name: str, window_s: float) -> list[dict]:
    """Compute time per mode, real vs simulated, split into prefill (to the first token) and decoding."""
    rows = []
    for mode in ("ad", "sd"):
        m = both[(both["mode"] == mode) & (both.sim_mode == mode) & both.outcome.isin(["served", "late"])]
        if m.empty:
            continue
        real = (m.latency_s - m.wait_s - m.plan_s) if "wait_s" in m else pd.Series(np.nan, index=m.index)
        sim = m.sim_latency_s - window_s
        real_pre = (m.ttft_s - m.wait_s - m.plan_s) if "ttft_s" in m and "wait_s" in m else pd.Series(np.nan, index=m.index)
        sim_pre = m.sim_prefill_s if "sim_prefill_s" in m else pd.Series(np.nan, index=m.index)
        row = {"scheduler": name, "mode": mode, "requests": len(m), "compute p50 real (s)": real.median(), "compute p50 sim (s)": sim.median(),
               "error %": _err(sim.median(), real.median()), "prefill p50 real (s)": real_pre.median(), "prefill p50 sim (s)": sim_pre.median(),
               "prefill error %": _err(sim_pre.median(), real_pre.median()), "decode p50 real (s)": (real - real_pre).median(),
               "decode p50 sim (s)": (sim - sim_pre).median(), "decode error %": _err((sim - sim_pre).median(), (real - real_pre).median())}
        rows.append(row)
    return rows


def _err(sim: float, real: float) -> float:
    return (sim - real) / real * 100 if real and np.isfinite(real) else np.nan


