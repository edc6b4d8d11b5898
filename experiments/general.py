"""One learned policy for every round size (issue 15 §1): the set policy vs BALANCE over K.

    python -m agents.imitation collect --out runs/general/data --ks 20,50,70,100,200 --rounds 1200,400,200,150,60
    python -m agents.imitation train --data runs/general/data --out runs/general/seed0 --seed 0   # seeds 0..4
    python -m experiments.general --runs runs/general                                         # this module

The policies are cloned from BALANCE (``agents.imitation``) and are each one network for every K
(``agents.set_policy``). This module:

1. ships the seed with the best **validation** score (``progress.csv``'s ``val_served_frac``; the
   test stream plays no part in the choice) to ``policies/general/``;
2. evaluates every seed's policy and BALANCE on the same **test** rounds (``envs.workload``, seed
   1000003) at each K in ``--ks``, in the paper setting and under prediction error (CV 0.3 on the
   acceptance and the output length, ``conf/env/noisy.yaml``): per seed the ratio of users served to
   BALANCE's and the paired per-round difference (bootstrap 95 % CI, Wilcoxon); across seeds the
   mean ratio with its Student-t 95 % CI and the seeds whose paired CI lies above / below BALANCE;
3. times whole rounds in one process on one thread: BALANCE vs the shipped policy (cached actor,
   ``agents.set_policy_fast``, env stepping included) at K = 200 and 500.

4. diagnoses, on **validation** rounds at ``--diagnose-k``, why the policy alone falls short there
   (its plans vs BALANCE's: modes, memory / compute used, thresholds).

Every seed runs the post-step ``agents.plan_repair.improve`` (``--post-step improve_mixed6_all_pairs``,
the default: with the AD-only re-pack over every (cap, floor) pair of ``agents.ad_prefix_search`` and
the six-threshold mixed re-pack of ``agents.mixed_repack``; ``improve_mixed_all_pairs`` with the
five-threshold mixed re-pack instead; ``improve_mixed`` with that and without the every-pair search;
``improve`` with neither; written into copies of the seed folders under ``runs/<post-step>/`` and into the
shipped ``policy.json``), and is reported without it too (``raw``).

Writes ``results/general.md``, ``general.csv`` (per seed), ``general_seeds.csv`` (across seeds),
``general_timing.csv``, ``general_diagnosis.csv`` and ``general.png`` (served / BALANCE vs K with
the across-seed CI).
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd

from agents.artefacts import write_csv_atomic, write_text_atomic
from agents.evaluate import evaluate_schedulers, summarize
from agents.imitation import ImitationConfig
from agents.paired_stats import t_interval
from agents.plan_repair import POST_STEP_OPTIONS
from agents.policy import PolicyScheduler, resolve_policy_path
from agents.registry import make_scheduler
from agents.threads import limit_threads
from envs.config import EnvConfig
from envs.cost_model import CostModel
from envs.workload import make_rounds
from experiments.general_report import COLS, plot, report

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
SEED = 1000003  #: the test stream's seed (as experiments.learned)
NOISE = {"alpha_cv": 0.3, "output_cv": 0.3}  #: conf/env/noisy.yaml
SETTINGS = {"paper": {}, "noisy": NOISE}


def seed_runs(runs: Path) -> list[tuple[int, Path]]:
    """``(seed, folder)`` of every finished policy folder ``runs/seed*`` (model.zip + policy.json + progress.csv)."""
    out = []
    for d in sorted(runs.glob("seed*")):
        if (d / "model.zip").is_file() and (d / "policy.json").is_file() and (d / "progress.csv").is_file():
            out.append((int(d.name[4:]), d))
    if not out:
        raise FileNotFoundError(f"no trained seed folders runs/seed*/ in {runs} (python -m agents.imitation train ...)")
    return out


def with_post_step(src: Path, dest: Path, post_step: str | None) -> Path:
    """``dest`` = the policy folder ``src`` (model.zip, ONNX, progress) with ``post_step`` in its
    policy.json (``agents.policy.PolicyScheduler`` runs it on every plan; None = as trained)."""
    import json

    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in ("model.zip", "policy.onnx", "progress.csv"):
        if (src / name).is_file():
            shutil.copy2(src / name, tmp / name)
    meta = json.loads((src / "policy.json").read_text())
    meta.pop("post_step", None)
    if post_step:
        meta["post_step"] = post_step
    (tmp / "policy.json").write_text(json.dumps(meta, indent=2))
    shutil.rmtree(dest, ignore_errors=True)
    tmp.replace(dest)
    return dest


def ship_best(runs: list[tuple[int, Path]], dest: Path, post_step: str | None = None) -> int:
    """Copy the seed with the best validation score to ``dest`` (with ``post_step``); returns its seed."""
    scores = {s: float(pd.read_csv(d / "progress.csv").val_served_frac.max()) for s, d in runs}
    best = max(scores, key=scores.get)
    with_post_step(dict(runs)[best], dest, post_step)
    return best


def env_for(policy: Path, k: int, setting: str) -> EnvConfig:
    _, meta = resolve_policy_path(policy)
    return EnvConfig.from_kwargs(**{**meta["env"], "num_users": k, **SETTINGS[setting]})


def balance_rows(cfg: EnvConfig, rnds: list, setting: str, cache: Path | None) -> pd.DataFrame:
    """BALANCE's per-round rows on ``rnds``, from ``cache`` when an earlier run left them (BALANCE is the slow part)."""
    path = cache / f"balance_{setting}_k{cfg.num_users}_n{len(rnds)}.csv" if cache else None
    if path is not None and path.is_file():
        return pd.read_csv(path)
    df = evaluate_schedulers(cfg, ["balance"], rounds=rnds, seed=SEED)
    if path is not None:
        write_csv_atomic(df, path)
    return df


def evaluate_k(runs: list[tuple[int, Path]], k: int, rounds: int, setting: str, cache: Path | None = None, raw: list[tuple[int, Path]] | None = None) -> pd.DataFrame:
    """BALANCE and every seed's policy (``policy s<seed>``; ``raw s<seed>``: the same without its
    post-step, when ``raw`` is given) on the same ``rounds`` test rounds of size ``k``: per-round rows."""
    cfg = env_for(runs[0][1], k, setting)
    rnds = make_rounds(cfg, rounds, SEED, split="test")
    parts = [balance_rows(cfg, rnds, setting, cache)]
    for label, folders in (("policy", runs), ("raw", raw or [])):
        for s, d in folders:
            parts.append(evaluate_schedulers(cfg, ["policy"], rounds=rnds, seed=SEED, policy_path=str(d)).assign(scheduler=f"{label} s{s}"))
    return pd.concat(parts, ignore_index=True).assign(setting=setting)


def across_seeds(summary: pd.DataFrame) -> dict:
    """Mean ratio to BALANCE over the seeds (Student-t 95 % CI) and the seeds significantly above / below."""
    g = summary[summary.scheduler.str.startswith("policy s")]
    ratio, ratio_ci = t_interval(g.ratio_to_balance.to_numpy())
    diff, diff_ci = t_interval(g.diff_vs_balance.to_numpy())
    return {"seeds": len(g), "ratio_to_balance": ratio, "ratio_ci95": ratio_ci, "ratio_min": g.ratio_to_balance.min(), "ratio_max": g.ratio_to_balance.max(),
            "diff_vs_balance": diff, "diff_ci95": diff_ci, "seeds_above_balance": int((g.diff_ci95_low > 0).sum()), "seeds_below_balance": int((g.diff_ci95_high < 0).sum())}


POLICY_REPEATS = 3  #: policy decisions timed per round (the median kept): one ~30 ms call is at the mercy of a busy host


def _timed_round(scheduler, rnd, repeats: int = 1) -> tuple[float, float]:
    """One round's decision: the plan's own seconds (wall clock) and this process's CPU seconds
    around the call, each the median over ``repeats`` calls."""
    wall, cpu = [], []
    for _ in range(repeats):
        c0 = time.process_time()
        wall.append(scheduler.plan(rnd).decision_s)
        cpu.append(time.process_time() - c0)
    return float(np.median(wall)), float(np.median(cpu))


def timing(policy: Path, ks: list[int], rounds: int, balance_rounds: dict[int, int]) -> pd.DataFrame:
    """Decision seconds per round of the policy and of BALANCE, same process, one thread, **paired**:
    on each of the first ``balance_rounds[k]`` rounds BALANCE decides right after the policy, and
    ``balance_over_policy`` is the median over those rounds of BALANCE's time / the policy's on the
    same round (min and max beside it) -- a host that slows down between two runs slows both sides
    of a ratio alike. ``policy_s_median`` is over all ``rounds`` rounds."""
    rows = []
    for k in ks:
        cfg = env_for(policy, k, "paper")
        cost = CostModel.from_config(cfg)
        rnds = make_rounds(cfg, rounds, SEED, split="test")
        pol = PolicyScheduler(cost, cfg.max_gamma, path=policy)
        pol.plan(rnds[0])  # warm-up (first-call allocations)
        nb = min(balance_rounds.get(k, rounds), rounds)
        bal = make_scheduler("balance", cost, cfg.max_gamma)
        pol_t, bal_t = [], []
        for i, rnd in enumerate(rnds):
            pol_t.append(_timed_round(pol, rnd, POLICY_REPEATS))
            if i < nb:
                bal_t.append(_timed_round(bal, rnd))
        (t_pol, cpu_pol), (t_bal, cpu_bal) = (np.array(x, dtype=float).reshape(-1, 2).T for x in (pol_t, bal_t))
        row = {"K": k, "policy_rounds": len(t_pol), "policy_s_median": float(np.median(t_pol)), "policy_ms_per_decision": 1e3 * float(np.median(t_pol)) / k,
               "balance_rounds": len(t_bal), "balance_s_median": float(np.median(t_bal)) if nb else float("nan")}
        # CPU seconds of this process (one thread): what the wall clock shows less the waits for a CPU on a shared host
        row["policy_cpu_s_median"] = float(np.median(cpu_pol))
        row["balance_cpu_s_median"] = float(np.median(cpu_bal)) if nb else float("nan")
        for name, b, q in (("balance_over_policy", t_bal, t_pol[:nb]), ("balance_over_policy_cpu", cpu_bal, cpu_pol[:nb])):
            ratio = b / q if nb else np.array([np.nan])
            row[name], row[f"{name}_min"], row[f"{name}_max"] = float(np.median(ratio)), float(ratio.min()), float(ratio.max())
        rows.append(row)
        print(f"[general] timing K={k}: {row}", flush=True)
    return pd.DataFrame(rows)


def diagnose(raw_policy: Path, k: int, rounds: int) -> pd.DataFrame:
    """Why the policy alone falls short at large K: per **validation** round, the plans of the policy as
    trained, the policy + each post-step, BALANCE (gamma 4) and BALANCE at the expert's gamma 2 -- users
    served, AD / SD, memory and compute used, and the thresholds that shape a batch (largest input,
    least slack among the admitted)."""
    from agents.balance import grid, split_search
    from agents.plan_repair import improve_plan
    from envs.feasibility import check_plans
    from envs.plan import AD, SD

    cfg = env_for(raw_policy, k, "paper")
    cost = CostModel.from_config(cfg)
    pol = PolicyScheduler(cost, cfg.max_gamma, path=raw_policy)
    bal = make_scheduler("balance", cost, cfg.max_gamma)
    g = grid(0.05)
    rows = []
    for i, rnd in enumerate(make_rounds(cfg, rounds, ImitationConfig().val_seed, split="validation")):
        p = pol.plan(rnd)
        b = bal.plan(rnd)
        plans = {"policy (raw)": (p.modes, p.gamma)}
        for post, options in POST_STEP_OPTIONS.items():
            q = improve_plan(cost, rnd, p, cfg.max_gamma, **options._asdict())
            plans[f"policy + {post}"] = (q.modes, q.gamma)
        plans |= {"balance (gamma 4)": (b.modes, b.gamma), "balance (gamma 2)": (split_search(cost, rnd, 2, g, g).modes, 2)}
        for name, (modes, gamma) in plans.items():
            modes = np.asarray(modes)
            rep = check_plans(cost, rnd, modes[None], gamma)
            adm = modes != 0
            rows.append({"round": i, "plan": name, "served": int(adm.sum()), "ad": int((modes == AD).sum()), "sd": int((modes == SD).sum()),
                         "memory_used": float((rep.ad_memory_bytes[0] + rep.sd_memory_bytes[0]) / rep.memory_budget_bytes[0]),
                         "compute_used": float(rep.ad_share_min[0] + rep.sd_share_min[0]),
                         "max_input": int(rnd.input_tokens[adm].max()) if adm.any() else 0, "min_slack_s": float(rnd.slack_s[adm].min()) if adm.any() else float("nan")})
    return pd.DataFrame(rows)


def int_list(p: argparse.ArgumentParser, name: str, text: str, low: int) -> list[int]:
    """``text`` as comma-separated integers >= ``low``; a parser error naming ``name`` otherwise."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        p.error(f"{name} must be comma-separated integers, got {text!r}")
    if not values or min(values) < low:
        p.error(f"{name} must be integers >= {low}, got {text!r}")
    return values


def k_rounds(p: argparse.ArgumentParser, k_name: str, ks: str, rounds_name: str, rounds: str) -> list[tuple[int, int]]:
    """``(K, rounds)`` pairs of two comma lists of equal length (K >= 1, rounds >= 1)."""
    k_values, n_values = int_list(p, k_name, ks, 1), int_list(p, rounds_name, rounds, 1)
    if len(k_values) != len(n_values):
        p.error(f"{k_name} and {rounds_name} must have one entry each per K, got {len(k_values)} and {len(n_values)}")
    return list(zip(k_values, n_values, strict=True))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m experiments.general", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--runs", type=Path, default=ROOT / "runs" / "general",
                   help="folder of the trained seeds seed0..seedN (agents.imitation train; recipe in conf/experiment/general.yaml)")
    p.add_argument("--ks", default="20,50,70,100,200", help="round sizes K of the paper setting")
    p.add_argument("--rounds", default="200,200,200,100,50", help="test rounds per K (paper setting)")
    p.add_argument("--noisy-ks", default="50,200", help="round sizes under prediction error (CV 0.3)")
    p.add_argument("--noisy-rounds", default="200,50", help="test rounds per noisy K")
    p.add_argument("--timing-ks", default="200,500", help="round sizes of the decision-time table")
    p.add_argument("--timing-rounds", type=int, default=10, help="policy rounds timed per K")
    p.add_argument("--balance-timing-rounds", default="200:10,500:1", help="K:rounds of BALANCE in the timing (0 = skip)")
    p.add_argument("--policies", type=Path, default=ROOT / "policies" / "general", help="where the best seed is shipped")
    p.add_argument("--results", type=Path, default=RESULTS, help="folder of general.md, the CSVs and the plot")
    p.add_argument("--cache", type=Path, default=None, help="folder for BALANCE's per-round rows (reused when present)")
    p.add_argument("--balance-only", action="store_true", help="only fill --cache with BALANCE's rows (needs one trained seed for the env config)")
    p.add_argument("--diagnose-k", type=int, default=200, help="K of the validation-round diagnosis (policy vs BALANCE plans)")
    p.add_argument("--diagnose-rounds", type=int, default=10, help="validation rounds of the diagnosis (0 = skip)")
    p.add_argument("--post-step", default="improve_mixed6_all_pairs", choices=[*POST_STEP_OPTIONS, "none"],
                   help="post-step every policy runs on its plan (agents.plan_repair.improve, timed with it); the seeds without it are reported beside ('raw')")
    args = p.parse_args(argv)
    # every argument is checked before anything is read, trained or written (a bad --ks once failed
    # only after the shipped policy folder had been rewritten)
    plan = [("paper", k, n) for k, n in k_rounds(p, "--ks", args.ks, "--rounds", args.rounds)]
    if args.noisy_ks:
        plan += [("noisy", k, n) for k, n in k_rounds(p, "--noisy-ks", args.noisy_ks, "--noisy-rounds", args.noisy_rounds)]
    for setting, k, _ in plan:
        try:
            EnvConfig.from_kwargs(**{**ImitationConfig().env(k).to_dict(), **SETTINGS[setting]})
        except ValueError as exc:
            p.error(f"K = {k} ({setting}): {exc}")
    timing_ks = int_list(p, "--timing-ks", args.timing_ks, 1) if args.timing_ks else []
    bal = {}
    for item in filter(None, args.balance_timing_rounds.split(",")):
        k, sep, n = item.partition(":")
        if not sep:
            p.error(f"--balance-timing-rounds: items must be K:rounds, got {item!r}")
        bal[int_list(p, "--balance-timing-rounds K", k, 1)[0]] = int_list(p, "--balance-timing-rounds rounds", n, 0)[0]
    if args.timing_rounds < 1:
        p.error(f"--timing-rounds must be >= 1, got {args.timing_rounds}")
    if args.diagnose_k < 1 or args.diagnose_rounds < 0:
        p.error(f"--diagnose-k must be >= 1 and --diagnose-rounds >= 0, got {args.diagnose_k} and {args.diagnose_rounds}")
    if args.balance_only and args.cache is None:
        p.error("--balance-only fills --cache: give --cache DIR")
    limit_threads(1)
    runs = seed_runs(args.runs) if not args.balance_only else []
    if args.balance_only:
        for setting, k, n in plan:
            cfg = EnvConfig.from_kwargs(**{**ImitationConfig().env(k).to_dict(), **SETTINGS[setting]})  # the policies' env (policy.json)
            balance_rows(cfg, make_rounds(cfg, n, SEED, split="test"), setting, args.cache)
            print(f"[general] BALANCE {setting} K={k}: {n} rounds cached", flush=True)
        return
    post = None if args.post_step == "none" else args.post_step
    raw = None
    if post:  # the seeds as trained stay untouched: the post-step goes into copies under runs/<post>/
        raw = runs
        runs = [(s, with_post_step(d, args.runs / post / d.name, post)) for s, d in runs]
    shipped = ship_best(raw or runs, args.policies, post)
    print(f"[general] seeds {[s for s, _ in runs]}; shipped seed {shipped} -> {args.policies}", flush=True)
    per_seed, seeds = [], []
    for setting, k, n in plan:
        start = time.perf_counter()
        summary = summarize(evaluate_k(runs, k, n, setting, args.cache, raw)).assign(setting=setting, K=k)
        per_seed.append(summary)
        seeds.append({"setting": setting, "K": k, "rounds": n, **across_seeds(summary)})
        if raw:
            seeds[-1]["raw_ratio_to_balance"] = across_seeds(summary.assign(scheduler=summary.scheduler.str.replace("raw s", "policy s", regex=False).where(summary.scheduler.str.startswith("raw s"), "x")))["ratio_to_balance"]
        print(f"[general] {setting} K={k}: {seeds[-1]} ({time.perf_counter() - start:.0f} s)", flush=True)
    per_seed_df, seeds_df = pd.concat(per_seed, ignore_index=True), pd.DataFrame(seeds)
    load_before = os.getloadavg()[0]
    times = timing(args.policies, timing_ks, args.timing_rounds, bal)
    load = f"1-minute load average {load_before:.1f} before the timing, {os.getloadavg()[0]:.1f} after ({os.cpu_count()} CPUs)"
    out = args.results
    write_csv_atomic(per_seed_df[COLS], out / "general.csv")
    write_csv_atomic(seeds_df, out / "general_seeds.csv")
    write_csv_atomic(times, out / "general_timing.csv")
    plot(seeds_df, out / "general.png")
    command = "python -m experiments.general " + " ".join(argv if argv is not None else __import__("sys").argv[1:])
    diag = None
    if args.diagnose_rounds > 0:
        diag = diagnose(dict(raw or runs)[shipped], args.diagnose_k, args.diagnose_rounds)
        write_csv_atomic(diag, out / "general_diagnosis.csv")
    write_text_atomic(out / "general.md", report(per_seed_df, seeds_df, times, shipped, command.strip(), load, SEED, diag, args.diagnose_k, post))
    print(f"[general] wrote {out / 'general.md'}", flush=True)


if __name__ == "__main__":
    main()
