"""Why the post-step falls short of BALANCE at K = 200 (issue 15 §1): BALANCE's mixed plans, on
**validation** rounds only.

    python -m experiments.mixed_plan_study --k 200 --rounds 200 --cache runs/mixed_plan_study --out results

The single-batch re-pack (``agents.plan_repair.improve``) equals BALANCE on (nearly) every round where
BALANCE's plan is all-AD, and loses a user on most rounds where BALANCE mixes AD and SD. This study asks why:

1. **Shape.** For every round where BALANCE (gamma 4, the paper's) mixes, the mixed family of
   ``agents.mixed_repack`` is evaluated at BALANCE's *own* thresholds -- AD: its largest input,
   least slack and count; SD: its least slack, most SD iterations and (six parameters) largest
   input -- at BALANCE's depth. ``family5`` / ``family6``: the users that family plan serves, and
   whether its AD and SD users are BALANCE's (``same5`` / ``same6``).
2. **Ridge.** At BALANCE's thresholds (six parameters), each parameter is moved alone to the
   neighbouring distinct values either side (``RIDGE_STEPS``); ``ridge_drop_share``: the share of
   those moves that serve fewer users. A local search must hit every threshold at once.
3. **Searches** (served on every validation round, against BALANCE's): ``improve`` (the single-batch
   re-pack on the shipped policy's raw plan), ``improve_mixed`` (the post-step shipped until ``improve_mixed_all_pairs`` added the AD-only re-pack over every pair: the re-pack
   with square ``MIXED_REFINE_CROSS`` plus the five-parameter re-pack at ``MIXED_DEPTH``), and
   ``family6_gG`` (``improve`` or the six-parameter re-pack at depth G, whichever serves more). CPU ms are this process's, one thread, per round (the
   re-pack alone for ``family6``).

Writes ``OUT/mixed_plan_study.csv`` (per round) and ``OUT/mixed_plan_study.md``. BALANCE's plans are
cached in ``--cache`` (BALANCE takes seconds per round at K = 200).
"""

from __future__ import annotations

import argparse
import io
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd

from agents.artefacts import check_writable, write_bytes_atomic, write_csv_atomic, write_text_atomic
from agents.imitation import ImitationConfig
from agents.mixed_repack import MIXED_DEPTH, MixedFamily, mixed_repack
from agents.plan_repair import MIXED_REFINE_CROSS, improve
from agents.policy import PolicyScheduler
from agents.registry import make_scheduler
from envs.cost_model import CostModel, sd_iterations
from envs.plan import AD, SD
from envs.workload import make_rounds
from experiments.general import env_for

BALANCE_DEPTH = 4  #: the paper's fixed draft depth (BALANCE in every results table)
RIDGE_STEPS = 3  #: distinct values either side of each of BALANCE's thresholds in the ridge test


def balance_plans(cfg, rnds: list, cache: Path | None) -> np.ndarray:
    """BALANCE's modes (rounds, K), from ``cache`` when an earlier run left them."""
    path = cache / f"balance_k{cfg.num_users}_n{len(rnds)}_seed{ImitationConfig().val_seed}.npy" if cache else None
    if path is not None and path.is_file():
        return np.load(path)
    bal = make_scheduler("balance", CostModel.from_config(cfg), cfg.max_gamma)
    modes = []
    for i, rnd in enumerate(rnds):
        modes.append(np.asarray(bal.plan(rnd).modes, dtype=np.int8))
        if (i + 1) % 20 == 0:
            print(f"[mixed_plan_study] BALANCE {i + 1}/{len(rnds)} rounds", flush=True)
    out = np.array(modes)
    if path is not None:
        buf = io.BytesIO()
        np.save(buf, out)
        write_bytes_atomic(path, buf.getvalue())
    return out


def own_thresholds(rnd, modes: np.ndarray, gamma: int) -> np.ndarray:
    """BALANCE's plan as a point of the six-parameter family: (S_A, f_A, m_A, f_S, J_S, S_S)."""
    a, s = modes == AD, modes == SD
    iters = sd_iterations(rnd.output_tokens, rnd.alpha, gamma)
    return np.array([rnd.input_tokens[a].max(), rnd.slack_s[a].min(), a.sum(), rnd.slack_s[s].min(), iters[s].max(), rnd.input_tokens[s].max()], dtype=float)


def shape_row(cost: CostModel, rnd, modes: np.ndarray) -> dict:
    """The family at BALANCE's own thresholds (five and six parameters) and the ridge around it."""
    row, at = {}, 0
    point = own_thresholds(rnd, modes, BALANCE_DEPTH)
    for n in (5, 6):
        fam = MixedFamily(cost, rnd, BALANCE_DEPTH, sd_input_cap=n == 6)
        keys, sd_counts = fam.score(point[None, :n])
        plan = fam.modes(point[:n], int(sd_counts[0]))
        row[f"family{n}"] = int(np.ceil(keys[0])) if keys[0] >= 0 else 0
        row[f"same{n}"] = bool(np.array_equal(plan, modes))
        at = int(np.ceil(keys[0]))
    # the ridge (the six-parameter family, ``fam`` and ``at`` of the last pass): each threshold alone
    # moved to its neighbouring distinct values
    moves = []
    for d, values in enumerate(fam.values):
        j = int(np.searchsorted(values, point[d]))
        for v in np.concatenate([values[max(0, j - RIDGE_STEPS) : j], values[j + 1 : j + 1 + RIDGE_STEPS]]):
            moved = point.copy()
            moved[d] = v
            moves.append(moved)
    keys, _ = fam.score(np.array(moves))
    row["ridge_drop_share"] = float((np.ceil(keys) < at).mean())
    return row


def run(policy: Path, k: int, rounds: int, cache: Path | None, depths: list[int]) -> pd.DataFrame:
    cfg = env_for(policy, k, "paper")
    cost = CostModel.from_config(cfg)
    rnds = make_rounds(cfg, rounds, ImitationConfig().val_seed, split="validation")
    raw = PolicyScheduler(cost, cfg.max_gamma, path=policy)  # loaded first: a broken policy fails before BALANCE's minutes
    raw.post_step = None
    bal = balance_plans(cfg, rnds, cache)
    rows = []
    for i, rnd in enumerate(rnds):
        modes = bal[i]
        row = {"round": i, "balance": int((modes != 0).sum()), "balance_ad": int((modes == AD).sum()), "balance_sd": int((modes == SD).sum())}
        row["balance_mixed"] = bool(row["balance_ad"] and row["balance_sd"])
        if row["balance_mixed"]:
            row.update(shape_row(cost, rnd, modes))
        p = raw.plan(rnd)
        t0 = time.process_time()
        m = improve(cost, rnd, p.modes, p.gamma, cfg.max_gamma)
        row["improve_ms"], row["improve"] = 1e3 * (time.process_time() - t0), int((m != 0).sum())
        t0 = time.process_time()
        m = improve(cost, rnd, p.modes, p.gamma, cfg.max_gamma, cross=MIXED_REFINE_CROSS, mixed_depth=MIXED_DEPTH)  # the improve_mixed post-step
        row["improve_mixed_ms"], row["improve_mixed"] = 1e3 * (time.process_time() - t0), int((m != 0).sum())
        for g in depths:
            t0 = time.process_time()
            _, key = mixed_repack(cost, rnd, g, sd_input_cap=True)
            row[f"family6_g{g}_ms"] = 1e3 * (time.process_time() - t0)
            row[f"family6_g{g}"] = max(row["improve"], int(np.ceil(key)))
        rows.append(row)
    return pd.DataFrame(rows)


def summarise(df: pd.DataFrame, depths: list[int]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the searches against BALANCE, the shape of BALANCE's mixed rounds)."""
    searches = []
    for name in ["improve", "improve_mixed", *(f"family6_g{g}" for g in depths)]:
        searches.append({"plan": name, "rounds": len(df), "served": int(df[name].sum()), "balance": int(df.balance.sum()),
                         "ratio_to_balance": df[name].sum() / df.balance.sum(), "rounds_below_balance": int((df[name] < df.balance).sum()),
                         "rounds_above_balance": int((df[name] > df.balance).sum()), "cpu_ms_median": float(df[f"{name}_ms"].median())})
    mixed = df[df.balance_mixed]
    shape = pd.DataFrame([{
        "mixed_rounds": len(mixed), "of_rounds": len(df),
        "family5_serves_balance": int((mixed.family5 >= mixed.balance).sum()) if len(mixed) else 0,
        "family5_same_plan": int(mixed.same5.sum()) if len(mixed) else 0,
        "family6_serves_balance": int((mixed.family6 >= mixed.balance).sum()) if len(mixed) else 0,
        "family6_same_plan": int(mixed.same6.sum()) if len(mixed) else 0,
        "ridge_drop_share_mean": float(mixed.ridge_drop_share.mean()) if len(mixed) else float("nan"),
        "improve_below_on_mixed": int((mixed.improve < mixed.balance).sum()) if len(mixed) else 0,
        "improve_below_on_all_ad": int(((df.improve < df.balance) & ~df.balance_mixed).sum()),
    }])
    return pd.DataFrame(searches), shape


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", type=Path, default=Path("policies/general"))
    ap.add_argument("--k", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=200, help="validation rounds")
    ap.add_argument("--depths", default="2,4", help="draft depths of the six-parameter re-pack")
    ap.add_argument("--cache", type=Path, default=None, help="folder for BALANCE's plans (reused when present)")
    ap.add_argument("--out", type=Path, default=Path("results"))
    args = ap.parse_args(argv)
    try:
        depths = [int(x) for x in args.depths.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--depths must be comma-separated integers, got {args.depths!r}") from None
    if args.k < 1 or args.rounds < 1 or not depths or any(d < 1 for d in depths):
        raise SystemExit("--k and --rounds must be >= 1, --depths a list of draft depths >= 1")
    try:
        check_writable(args.out, "--out", directory=True)
        max_gamma = env_for(args.policy, args.k, "paper").max_gamma
    except (ValueError, FileNotFoundError) as exc:
        raise SystemExit(str(exc)) from None
    if max(depths) > max_gamma:
        raise SystemExit(f"--depths must lie in [1, {max_gamma}] (the policy's largest draft depth), got {args.depths!r}")
    import torch

    torch.set_num_threads(1)
    df = run(args.policy, args.k, args.rounds, args.cache, depths)
    searches, shape = summarise(df, depths)
    write_csv_atomic(df, args.out / "mixed_plan_study.csv")
    md = ["# BALANCE's mixed plans and the post-step (issue 15 §1)", "",
          f"Validation stream (seed {ImitationConfig().val_seed}), never test; K = {args.k}, {args.rounds} rounds; BALANCE at gamma "
          f"{BALANCE_DEPTH}; shipped policy `{args.policy}`. Per round: `mixed_plan_study.csv`. The module docstring defines every column.", "",
          "## The shape of BALANCE's mixed plans", "",
          "`familyN_serves_balance` / `familyN_same_plan`: mixed rounds where the N-parameter family at BALANCE's own thresholds serves as "
          "many users as BALANCE / rebuilds its exact plan; `ridge_drop_share_mean`: the share of one-threshold moves (up to "
          f"{RIDGE_STEPS} distinct values either side) that serve fewer users; `improve_below_on_*`: rounds where the single-batch re-pack (`improve`) "
          "serves fewer than BALANCE.", "",
          shape.to_markdown(index=False, floatfmt=".3g"), "",
          "## Searches against BALANCE", "",
          searches.to_markdown(index=False, floatfmt=".5g"), "",
          f"1-minute load average {os.getloadavg()[0]:.1f} at the end ({os.cpu_count()} CPUs).", "",
          f"Reproduce: `python -m experiments.mixed_plan_study --k {args.k} --rounds {args.rounds} --depths {args.depths}"
          + (f" --cache {args.cache}" if args.cache else "") + f" --out {args.out}`", ""]
    write_text_atomic(args.out / "mixed_plan_study.md", "\n".join(md))
    print(shape.to_string(index=False))
    print(searches.to_string(index=False))


if __name__ == "__main__":
    main()
