"""A run of ``experiments.split_sim_vs_real`` as it is kept: its report (``summary.md``, the CSVs,
the planning profile), the command line that reruns its live part (the report's ``Reproduce``
line), and ``--resimulate DIR``: its rounds planned and costed again from the records, the live part
not rerun. Separate from the driver (:mod:`experiments.split_sim_vs_real`: the server, the edges,
the CLI) and from the simulator (:mod:`experiments.split_sim_vs_real_simulate`).

A report records the live options in its ``Reproduce`` line; an option added later is read, for a
report without it, as what the runs before it did (``--pin-cpus off``, ``--device-sharing os``,
``--rtt-report link``).
"""

from __future__ import annotations

import argparse
import re
import shlex
import tempfile
import time
from pathlib import Path

import pandas as pd

from agents.artefacts import write_csv_atomic, write_text_atomic
from experiments.split_sim_vs_real_simulate import compare, compare_parts, simulate
from runtime.machine_profile import profile_file

#: the options that describe a live run (the rest -- --completion, --sim-rtt, --out, --resimulate -- are the simulator's or the report's)
LIVE_OPTIONS = ("schedulers", "policy", "settings", "rounds", "edge_users", "http_users", "tokens", "deadline_s", "rtt_ms", "window_s", "alpha",
                "cohorts", "threads", "profile", "auto_profile", "remeasure_profile", "pair", "seed", "pin_cpus",
                "device_sharing", "rtt_report")


def recorded_options(ap: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with the live run's options taken from ``DIR/summary.md``'s Reproduce line (``args``
    unchanged without one). A report from before ``--pin-cpus`` ran unpinned. A live option given on
    the command line (not at its default) that contradicts the record is an error."""
    summary = args.resimulate / "summary.md"
    line = re.search(r"^Reproduce[^`\n]*`python -m experiments\.split_sim_vs_real ([^`]*)`", summary.read_text(), re.M) if summary.is_file() else None
    if line is None:
        return args
    recorded_argv = shlex.split(line.group(1))
    if "--pin-cpus" not in recorded_argv:
        recorded_argv += ["--pin-cpus", "off"]
    if "--device-sharing" not in recorded_argv:  # before the switch the server's verifier ran as a free thread
        recorded_argv += ["--device-sharing", "os"]
    if "--rtt-report" not in recorded_argv:  # before stop 43 the edges reported the emulated RTT alone
        recorded_argv += ["--rtt-report", "link"]
    try:
        recorded = ap.parse_args(recorded_argv)
    except SystemExit:  # argparse has printed why
        raise ValueError(f"the Reproduce line of {summary} does not parse: {line.group(1)}") from None
    default = ap.parse_args([])
    for name in LIVE_OPTIONS:
        given, kept = getattr(args, name), getattr(recorded, name)
        if given != getattr(default, name) and given != kept:
            raise ValueError(f"the run's Reproduce line ({summary}) has --{name.replace('_', '-')} {kept}, the command line {given}")
        setattr(args, name, kept)
    return args


def resimulate(args: argparse.Namespace) -> None:
    """``--resimulate DIR``: plan and cost a finished run's rounds again (no live part) and rewrite its report."""
    src = args.resimulate
    live_rows = pd.read_csv(src / "requests.csv")
    if live_rows.empty:
        raise SystemExit(f"--resimulate: {src / 'requests.csv'} holds no requests")
    live_rows = live_rows.drop(columns=[c for c in live_rows.columns if c.startswith("sim_")])
    rounds = ["scheduler", "setting", "round"]
    found = {"schedulers": ",".join(sorted(live_rows.scheduler.unique())), "settings": ",".join(sorted(live_rows.setting.unique())),
             "rounds": int(live_rows["round"].max()) + 1, "edge_users": int(live_rows.kind.eq("edge").groupby([live_rows[c] for c in rounds]).sum().max()),
             "http_users": int(live_rows.kind.eq("http").groupby([live_rows[c] for c in rounds]).sum().max())}
    asked = {"schedulers": ",".join(sorted(args.schedulers.split(","))), "settings": ",".join(sorted(args.settings.split(","))), "rounds": args.rounds,
             "edge_users": args.edge_users, "http_users": args.http_users if "mix" in args.settings.split(",") else found["http_users"]}
    for name, value in found.items():  # the header and the reproduce line would describe another run
        if asked[name] != value:
            raise SystemExit(f"--resimulate: {src / 'requests.csv'} has {name.replace('_', '-')} {value}, the arguments say {asked[name]}; "
                             "pass the run's own arguments (its report records none; --pin-cpus off for runs from before that switch)")
    saved = src / "profile.yaml"
    profile_text = saved.read_text() if saved.is_file() else profile_file(args.profile).read_text()
    old = (src / "summary.md").read_text().splitlines() if (src / "summary.md").is_file() else []
    keep = [line for line in old if line.startswith(("**Planning profile**", "Wall time of the live part", "Link probes"))]
    with tempfile.TemporaryDirectory() as tmp:  # the profile as the run saved it, whatever --out overwrites
        path = Path(tmp) / "profile.yaml"
        path.write_text(profile_text)
        both = pd.concat([simulate(df, s, str(path), args.window_s, args.policy, args.completion, args.sim_rtt)
                          for s, df in live_rows.groupby("scheduler", sort=False)])
    if not any(line.startswith("**Planning profile**") for line in keep):
        keep.insert(0, f"**Planning profile**: `{saved if saved.is_file() else args.profile}` (the run's own report recorded none).")
    keep.append(f"Reproduce (the live run): `{command(args)}`")
    again = (f"python -m experiments.split_sim_vs_real --resimulate {src}" + ("" if args.completion == "own" else f" --completion {args.completion}")
             + ("" if args.sim_rtt == "reported" else f" --sim-rtt {args.sim_rtt}") + ("" if args.out == src else f" --out {args.out}"))
    keep.append(f"Re-simulated on {time.strftime('%Y-%m-%d')} with this code and the run's {'saved profile' if saved.is_file() else 'profile'}, "
                f"the live part not rerun: `{again}`")
    named = re.search(r"planning profile `([^`]+)`", "\n".join(old))  # the name the run's header gave its saved profile
    name = (named.group(1) if named else saved.name) if saved.is_file() else profile_file(args.profile).name
    write_report(args, both, compare(both), keep, profile_text, name)


def command(args: argparse.Namespace) -> str:
    """The command line that reruns ``args``'s live run."""
    return (f"python -m experiments.split_sim_vs_real --schedulers {args.schedulers} --settings {args.settings} --rounds {args.rounds} "
            f"--edge-users {args.edge_users} --http-users {args.http_users} --tokens {args.tokens[0]} {args.tokens[1]} "
            f"--deadline-s {args.deadline_s[0]:g} {args.deadline_s[1]:g} --rtt-ms {args.rtt_ms[0]:g} {args.rtt_ms[1]:g} --window-s {args.window_s:g} "
            f"--cohorts {args.cohorts} --profile {args.profile} --seed {args.seed}" + (" --pair PATH" if args.pair else "")
            + (f" --policy {args.policy}" if "policy" in args.schedulers.split(",") else "")
            + (f" --alpha {args.alpha:g}" if args.alpha != 0.8 else "") + (f" --threads {args.threads}" if args.threads != 1 else "")
            + ("" if args.auto_profile else " --no-auto-profile") + (" --remeasure-profile" if args.remeasure_profile else "")
            + ("" if args.completion == "own" else f" --completion {args.completion}") + f" --pin-cpus {args.pin_cpus}"
            + f" --device-sharing {args.device_sharing} --rtt-report {args.rtt_report}")


def write_report(args, both: pd.DataFrame, table: pd.DataFrame, live_lines: list[str], profile_text: str, profile_name: str) -> None:
    """Write ``requests.csv``, ``summary.csv``, ``profile.yaml`` and ``summary.md`` to ``args.out``;
    ``live_lines``: the paragraphs on the live part (planning profile, wall time, reproduce line)."""
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv_atomic(both, args.out / "requests.csv")
    write_csv_atomic(table, args.out / "summary.csv")
    parts = compare_parts(both)
    if not parts.empty:
        write_csv_atomic(parts, args.out / "iteration_parts.csv")
    write_text_atomic(args.out / "profile.yaml", profile_text)  # what both sides planned with, to re-simulate or inspect
    text = "\n".join([
        "# Simulated (v1) vs real: edge users", "",
        f"`runtime.serve placement=split` on loopback, the project's pair on this CPU ({args.threads} torch thread(s) in the server and in the edges' process), "
        f"planning profile `{profile_name}` (saved as `profile.yaml`; below), the server's online calibration pinned at 1; {args.rounds} rounds per setting, one round at a time: "
        f"`ed` = {args.edge_users} edge users, `mix` = {args.edge_users} edge + {args.http_users} HTTP users; max_tokens in {args.tokens}, deadlines in "
        f"{args.deadline_s} s, RTTs in {args.rtt_ms} ms (the edges' verification links delayed by it), {args.cohorts} verification cohorts, "
        f"round window {args.window_s} s; " + ("the server pinned to one CPU and the edges to another (`--pin-cpus on`)" if args.pin_cpus == "on"
                                               else "server and edges on any CPU (`--pin-cpus off`)")
        + ("; the verifier and the AD/SD engines took turns at the plan's ED share (`--device-sharing turns`)" if args.device_sharing == "turns"
           else "; the verifier and the AD/SD engines ran as free threads (`--device-sharing os`)")
        + ("; edge users reported the round trip they measured, the emulated RTT plus their own round trips' stack time (`--rtt-report measured`), "
           "which the server and the simulator planned with" if args.rtt_report == "measured" else "; edge users reported the emulated RTT (`--rtt-report link`)")
        + ". ED users drafted at the plan's depth. Latency: arrival at the server -> end (ED: the edge's report of its last token). "
        "*ED users*: mode ED in the live plan and in the simulated one. *sim*: the acceptance estimate realised; *sim, measured acceptance*: each "
        "ED/SD user's measured acceptance. Edge drafting shares one CPU process (the model gives each edge its own device). "
        "Simulated users end "
        + ("at their own last token (ED: its own iterations x its own edge iteration, verify passes at the batch occupancy; AD/SD: its own passes "
           "at its batch's size and share; as live)" if args.completion == "own" else "at their batch's end (ED: its most iterations x its slowest edge iteration)")
        + " (`--completion " + args.completion + "`); *sim, batch completion*: the estimate realised and every user ending at its batch's end "
        "(the v1 environment's default outcome)."
        + ("" if args.sim_rtt == "reported" else " **Ablation** (`--sim-rtt emulated`): the simulator planned edge users with the emulated RTT "
           "alone, not the round trip they reported to the server (the plans may pick other depths than the server's)."), "",
        table.to_markdown(index=False, floatfmt=".3g"), "",
        *(["**ED iterations, part by part** (mean ms per iteration of ED users served in both; live from the edges' iteration logs, simulated "
           "from the model's terms, the prompt's prefill spread over the iterations on both sides: `ed_iteration_parts`):", "", parts.to_markdown(index=False, floatfmt=".3g"), ""] if not parts.empty else []),
        *[part for line in live_lines for part in (line, "")],
    ])
    write_text_atomic(args.out / "summary.md", text)
    print(text)
