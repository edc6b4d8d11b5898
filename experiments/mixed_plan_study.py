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
3. **Searches** (served on every validation round, against BALANCE's): every post-step a policy can
   name (``agents.plan_repair.POST_STEP_OPTIONS``: ``improve``, ``improve_mixed``,
   ``improve_mixed_all_pairs``, ``improve_mixed6_all_pairs``) on the shipped policy's raw plan, and
   the **six-parameter variants** ``six_gG_wW_pP_mM``: the re-pack with square ``MIXED_REFINE_CROSS``
   and the every-pair AD search (column ``repack_all_pairs``; on rounds of up to
   ``ALL_PAIRS_MAX_USERS`` users, as ``improve_plan`` runs it), then the six-parameter mixed re-pack at
   depth G with windows W, up to P passes and its line searches gated at margin M (``none``: always
   run), as ``improve_mixed6_all_pairs`` runs it -- the grid that chose ``SIX_WINDOW``, ``SIX_PASSES``
   and ``SIX_SEARCH_MARGIN``. CPU ms are this process's, one thread, per round (a variant's: the base's
   plus its re-pack's; ``<variant>_searched``: whether its line searches ran, ``searched_share`` in the
   summary).

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
from agents.mixed_repack import (
    MIXED_DEPTH,
    SIX_PASSES,
    SIX_SEARCH_MARGIN,
    SIX_WINDOW,
    MixedFamily,
)
from agents.plan_repair import (
    ALL_PAIRS_MAX_USERS,
    MIXED_REFINE_CROSS,
    POST_STEP_OPTIONS,
    improve,
    improve_plan,
    six_mixed_plan,
)
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


def variant_name(depth: int, window: int, passes: int, margin: int | None) -> str:
    """A six-parameter variant's column: ``six_gG_wW_pP_mM`` (``mnone``: line searches always run)."""
    return f"six_g{depth}_w{window}_p{passes}_m{'none' if margin is None else margin}"


def run(policy: Path, k: int, rounds: int, cache: Path | None, variants: list[tuple[int, int, int, int | None]]) -> pd.DataFrame:
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
        row["raw"] = int((np.asarray(p.modes) != 0).sum())
        for post, options in POST_STEP_OPTIONS.items():
            t0 = time.process_time()
            q = improve_plan(cost, rnd, p, cfg.max_gamma, **options._asdict())
            row[f"{post}_ms"], row[post] = 1e3 * (time.process_time() - t0), int((np.asarray(q.modes) != 0).sum())
        t0 = time.process_time()
        # as improve_plan runs it: the every-pair search only on rounds of up to ALL_PAIRS_MAX_USERS
        m = improve(cost, rnd, p.modes, p.gamma, cfg.max_gamma, cross=MIXED_REFINE_CROSS, all_pairs_ad=k <= ALL_PAIRS_MAX_USERS)
        row["repack_all_pairs_ms"], row["repack_all_pairs"] = 1e3 * (time.process_time() - t0), int((m != 0).sum())
        base = row["repack_all_pairs"]
        grid_best = {}  # per depth: the users the six-parameter start grid's best plan serves (whether a gate lets the search run)
        for depth, window, passes, margin in variants:
            name = variant_name(depth, window, passes, margin)
            if depth not in grid_best:
                fam = MixedFamily(cost, rnd, depth, sd_input_cap=True)
                grid_best[depth] = int(np.ceil(fam.score(fam.start_grid())[0].max()))
            row[f"{name}_searched"] = margin is None or grid_best[depth] >= base - margin
            t0 = time.process_time()
            found = six_mixed_plan(cost, rnd, depth, base, window=window, passes=passes, margin=margin)  # the post-step's own last stage
            served = base if found is None else int((found[0] != 0).sum())
            row[f"{name}_ms"], row[name] = row["repack_all_pairs_ms"] + 1e3 * (time.process_time() - t0), served
        if (i + 1) % 20 == 0:
            print(f"[mixed_plan_study] searches {i + 1}/{len(rnds)} rounds", flush=True)
        rows.append(row)
    return pd.DataFrame(rows)


def summarise(df: pd.DataFrame, variants: list[tuple[int, int, int, int | None]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the searches against BALANCE, the shape of BALANCE's mixed rounds)."""
    searches = []
    for name in [*POST_STEP_OPTIONS, "repack_all_pairs", *(variant_name(*v) for v in variants)]:
        searches.append({"plan": name, "rounds": len(df), "served": int(df[name].sum()), "balance": int(df.balance.sum()),
                         "ratio_to_balance": df[name].sum() / df.balance.sum(), "rounds_below_balance": int((df[name] < df.balance).sum()),
                         "rounds_above_balance": int((df[name] > df.balance).sum()), "cpu_ms_median": float(df[f"{name}_ms"].median()),
                         "cpu_ms_mean": float(df[f"{name}_ms"].mean()), "cpu_ms_max": float(df[f"{name}_ms"].max()),
                         "searched_share": float(df[f"{name}_searched"].mean()) if f"{name}_searched" in df else float("nan")})
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


def _ints(text: str, flag: str, none_ok: bool = False) -> list:
    out = []
    for x in text.split(","):
        x = x.strip()
        if none_ok and x == "none":
            out.append(None)
        elif x:
            try:
                out.append(int(x))
            except ValueError:
                raise SystemExit(f"{flag} must be comma-separated integers{' or none' if none_ok else ''}, got {text!r}") from None
    if not out:
        raise SystemExit(f"{flag} must name at least one value, got {text!r}")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--policy", type=Path, default=Path("policies/general"), help="the policy whose raw plans the post-steps start from")
    ap.add_argument("--k", type=int, default=200, help="users per round")
    ap.add_argument("--rounds", type=int, default=200, help="validation rounds")
    ap.add_argument("--depths", default="2,3", help="draft depths of the six-parameter variants")
    ap.add_argument("--windows", default="6,8", help="line-search windows of the six-parameter variants")
    ap.add_argument("--passes", default="1,6,10", help="most line-search passes of the six-parameter variants")
    ap.add_argument("--margins", default="2,3,4,none", help="search margins of the six-parameter variants (none: always search)")
    ap.add_argument("--cache", type=Path, default=None, help="folder for BALANCE's plans (reused when present)")
    ap.add_argument("--out", type=Path, default=Path("results"), help="folder of mixed_plan_study.md / .csv (the default rewrites the shipped study)")
    args = ap.parse_args(argv)
    depths, windows = _ints(args.depths, "--depths"), _ints(args.windows, "--windows")
    passes, margins = _ints(args.passes, "--passes"), _ints(args.margins, "--margins", none_ok=True)
    if args.k < 1 or args.rounds < 1 or min(depths) < 1 or min(windows) < 1 or min(passes) < 1 or any(m is not None and m < 0 for m in margins):
        raise SystemExit("--k, --rounds, --depths, --windows and --passes must be >= 1, --margins >= 0 or none")
    try:
        check_writable(args.out, "--out", directory=True)
        max_gamma = env_for(args.policy, args.k, "paper").max_gamma
    except (ValueError, FileNotFoundError) as exc:
        raise SystemExit(str(exc)) from None
    if max(depths) > max_gamma:
        raise SystemExit(f"--depths must lie in [1, {max_gamma}] (the policy's largest draft depth), got {args.depths!r}")
    import torch

    torch.set_num_threads(1)
    variants = [(d, w, p, m) for d in depths for w in windows for p in passes for m in margins]
    df = run(args.policy, args.k, args.rounds, args.cache, variants)
    searches, shape = summarise(df, variants)
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
          "## Post-steps against BALANCE", "",
          "Each post-step a policy can name, on the shipped policy's raw plans (`agents.plan_repair.POST_STEP_OPTIONS`); "
          "`repack_all_pairs`: the re-pack and the every-pair AD search alone (the base of the variants below).", "",
          searches[~searches.plan.str.startswith("six_")].to_markdown(index=False, floatfmt=".5g"), "",
          "## Six-parameter variants", "",
          "`six_gG_wW_pP_mM`: `repack_all_pairs`, then the six-parameter mixed re-pack at draft depth G, line searches W distinct values "
          "either side, at most P passes, run only when its start grid is within M users of the base (`mnone`: always; "
          "`searched_share`: the share of rounds where they ran); CPU ms include the base's. The shipped `improve_mixed6_all_pairs` is "
          f"`{variant_name(MIXED_DEPTH, SIX_WINDOW, SIX_PASSES, SIX_SEARCH_MARGIN)}`.", "",
          searches[searches.plan.str.startswith("six_")].to_markdown(index=False, floatfmt=".5g"), "",
          f"1-minute load average {os.getloadavg()[0]:.1f} at the end ({os.cpu_count()} CPUs).", "",
          f"Reproduce: `python -m experiments.mixed_plan_study --k {args.k} --rounds {args.rounds} --depths {args.depths} --windows {args.windows} "
          f"--passes {args.passes} --margins {args.margins}"
          + (f" --cache {args.cache}" if args.cache else "") + f" --out {args.out}`", ""]
    write_text_atomic(args.out / "mixed_plan_study.md", "\n".join(md))
    print(shape.to_string(index=False))
    print(searches.to_string(index=False))


if __name__ == "__main__":
    main()
