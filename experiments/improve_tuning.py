"""How the policy post-step was chosen (issue 15 §1): ``agents.plan_repair.improve`` on
**validation** rounds only.

For each K, the shipped general policy plans every validation round without its post-step (its raw
plans, as trained); ``improve`` then re-packs them with each refinement square ``cross`` (0 = the
cap and floor lines only), and an exhaustive variant tries every (input cap, slack floor) pair of
the round with the AD-only re-pack -- what no grid can beat with AD alone. ``mixedD`` adds the
mixed re-pack (``agents.mixed_repack``: an AD and an SD batch rebuilt from scratch, SD at draft
depth D) to the default refinement: the rows that chose ``MIXED_DEPTH`` and the ``improve_mixed``
post-step; ``mixedD_crossC`` the same with the refinement square ``C`` (``--mixed-crosses``: the
rows that chose ``MIXED_REFINE_CROSS``); ``mixedD_crossC_allpairs`` the same with the AD-only re-pack
searched over every (cap, floor) pair (``agents.ad_prefix_search``, the ``improve_mixed_all_pairs``
post-step) instead of its grid (``--all-pairs-crosses``). Each is compared with BALANCE (gamma 4, the paper's) on the
same rounds. CPU milliseconds per round are this process's (one thread); read them as ratios between
rows of one run. ``balance_over_decision``: BALANCE's CPU time per round over the whole decision's
(the policy's own plan, ``raw_ms``, plus the post-step), medians over the rounds -- the speed
target (issue 15: >= 100x at K = 200) checked on validation rounds before any test round is run.

Writes ``OUT/improve_tuning.csv`` and ``OUT/improve_tuning.md``.

    python -m experiments.improve_tuning --ks 100,200 --rounds 40 --crosses 0,8,12,16 --mixed-depths 1,2,3,4 --mixed-crosses 0,8 --all-pairs-crosses 0,4,8 --out results
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd

from agents.artefacts import write_csv_atomic, write_text_atomic
from agents.imitation import ImitationConfig
from agents.plan_repair import REFINE_CROSS, improve
from agents.policy import PolicyScheduler
from agents.prefix_fill import longest_prefixes
from agents.registry import make_scheduler
from envs.cost_model import CostModel
from envs.plan import AD
from envs.workload import make_rounds
from experiments.general import env_for


def every_pair_ad(cost: CostModel, rnd, gamma: int) -> int:
    """Users served by the best AD-only re-pack over every (input cap, slack floor) pair of the round."""
    order = np.lexsort((rnd.input_tokens, rnd.output_tokens))
    inp, slack = rnd.input_tokens[order], rnd.slack_s[order]
    caps, floors = np.unique(rnd.input_tokens).astype(float), np.unique(rnd.slack_s)
    best = 0
    for chunk in np.array_split(floors, max(1, len(floors) // 20)):
        c, f = np.repeat(caps, len(chunk)), np.tile(chunk, len(caps))
        eligible = (inp <= c[:, None]) & (slack >= f[:, None])
        counts, _ = longest_prefixes(cost, rnd, order, eligible, AD, gamma, (0.0, 0.0), False)
        best = max(best, int(counts.max()))
    return best


def mixed_name(depth: int, cross: int) -> str:
    """A mixed row's name: ``mixedD`` with the default square, ``mixedD_crossC`` otherwise."""
    return f"mixed{depth}" if cross == REFINE_CROSS else f"mixed{depth}_cross{cross}"


def all_pairs_name(depth: int, cross: int) -> str:
    """A mixed row whose AD-only re-pack covers every (cap, floor) pair: ``mixedD_crossC_allpairs``."""
    return f"mixed{depth}_cross{cross}_allpairs"


def run(policy: Path, ks: list[int], rounds: int, crosses: list[int], mixed_depths: list[int] = (), mixed_crosses: list[int] = (),
        all_pairs_crosses: list[int] = ()) -> pd.DataFrame:
    rows = []
    for k in ks:
        cfg = env_for(policy, k, "paper")
        cost = CostModel.from_config(cfg)
        raw = PolicyScheduler(cost, cfg.max_gamma, path=policy)
        raw.post_step = None  # the policy's own plans; the post-step is what is being tuned
        bal = make_scheduler("balance", cost, cfg.max_gamma)
        rnds = make_rounds(cfg, rounds, ImitationConfig().val_seed, split="validation")
        for i, rnd in enumerate(rnds):
            t0 = time.process_time()
            p = raw.plan(rnd)
            raw_ms = 1e3 * (time.process_time() - t0)
            t0 = time.process_time()
            b = int((np.asarray(bal.plan(rnd).modes) != 0).sum())
            row = {"K": k, "round": i, "balance": b, "balance_decision_ms": 1e3 * (time.process_time() - t0), "raw": int((np.asarray(p.modes) != 0).sum()), "raw_ms": raw_ms}
            for c in crosses:
                t0 = time.process_time()
                m = improve(cost, rnd, p.modes, p.gamma, cfg.max_gamma, cross=c)
                row[f"cross{c}_ms"] = 1e3 * (time.process_time() - t0)
                row[f"cross{c}"] = int((m != 0).sum())
            for depth in mixed_depths:
                for c in dict.fromkeys([REFINE_CROSS, *mixed_crosses]):
                    t0 = time.process_time()
                    m = improve(cost, rnd, p.modes, p.gamma, cfg.max_gamma, cross=c, mixed_depth=depth)
                    row[f"{mixed_name(depth, c)}_ms"] = 1e3 * (time.process_time() - t0)
                    row[mixed_name(depth, c)] = int((m != 0).sum())
                for c in all_pairs_crosses:
                    t0 = time.process_time()
                    m = improve(cost, rnd, p.modes, p.gamma, cfg.max_gamma, cross=c, mixed_depth=depth, all_pairs_ad=True)
                    row[f"{all_pairs_name(depth, c)}_ms"] = 1e3 * (time.process_time() - t0)
                    row[all_pairs_name(depth, c)] = int((m != 0).sum())
            row["every_pair_ad"] = max(row["raw"], every_pair_ad(cost, rnd, max(int(p.gamma), 1)))
            rows.append(row)
        print(f"[improve_tuning] K={k}: {rounds} validation rounds", flush=True)
    return pd.DataFrame(rows)


def summarise(df: pd.DataFrame, crosses: list[int], mixed_depths: list[int] = (), mixed_crosses: list[int] = (),
              all_pairs_crosses: list[int] = ()) -> pd.DataFrame:
    out = []
    mixed = [mixed_name(d, c) for d in mixed_depths for c in dict.fromkeys([REFINE_CROSS, *mixed_crosses])]
    mixed += [all_pairs_name(d, c) for d in mixed_depths for c in all_pairs_crosses]
    for k, g in df.groupby("K"):
        for name in ["raw", *(f"cross{c}" for c in crosses), *mixed, "every_pair_ad"]:
            # raw has no post-step: its own column raw_ms is the policy's plan, counted once in the decision
            post_ms = 0.0 if name == "raw" else g.get(f"{name}_ms")  # None: a row without a post-step timing (every_pair_ad)
            decision = float((g.raw_ms + post_ms).median()) if post_ms is not None and "raw_ms" in g else None
            out.append({"K": k, "plan": name, "rounds": len(g), "ratio_to_balance": g[name].sum() / g.balance.sum(),
                        "rounds_below_balance": int((g[name] < g.balance).sum()), "rounds_above_balance": int((g[name] > g.balance).sum()),
                        "cpu_ms_median": float(g[f"{name}_ms"].median()) if name != "raw" and f"{name}_ms" in g else float("nan"),
                        "decision_cpu_ms_median": float("nan") if decision is None else decision,
                        "balance_over_decision": float(g.balance_decision_ms.median()) / decision if decision and "balance_decision_ms" in g else float("nan")})
    return pd.DataFrame(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", type=Path, default=Path("policies/general"))
    ap.add_argument("--ks", default="100,200")
    ap.add_argument("--rounds", type=int, default=40, help="validation rounds per K")
    ap.add_argument("--crosses", default="0,8,12,16", help="refinement squares to compare (users either side)")
    ap.add_argument("--mixed-depths", default="1,2,3,4", help="draft depths of the mixed re-pack to compare ('' for none)")
    ap.add_argument("--mixed-crosses", default="", help="refinement squares besides REFINE_CROSS for the mixed rows ('' for none)")
    ap.add_argument("--all-pairs-crosses", default="", help="refinement squares of mixed rows whose AD-only re-pack covers every pair ('' for none)")
    ap.add_argument("--out", type=Path, default=Path("results"))
    args = ap.parse_args(argv)
    ks, crosses = [int(x) for x in args.ks.split(",")], [int(x) for x in args.crosses.split(",")]
    depths = [int(x) for x in args.mixed_depths.split(",") if x.strip()]
    mixed_crosses = [int(x) for x in args.mixed_crosses.split(",") if x.strip()]
    all_pairs = [int(x) for x in args.all_pairs_crosses.split(",") if x.strip()]
    if args.rounds < 1 or any(k < 1 for k in ks) or any(c < 0 for c in crosses + mixed_crosses + all_pairs) or any(d < 1 for d in depths):
        raise SystemExit("--rounds and --ks must be >= 1, --crosses, --mixed-crosses and --all-pairs-crosses >= 0, --mixed-depths >= 1")
    import torch

    torch.set_num_threads(1)
    df = run(args.policy, ks, args.rounds, crosses, depths, mixed_crosses, all_pairs)
    summary = summarise(df, crosses, depths, mixed_crosses, all_pairs)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv_atomic(df, args.out / "improve_tuning.csv")
    md = ["# The policy post-step, chosen on validation rounds (issue 15 §1)", "",
          f"Shipped policy `{args.policy}` without its post-step (`raw`), then `agents.plan_repair.improve` with each refinement square "
          "(`crossN`: every (cap, floor) pair among the N distinct values either side of the best point; `cross0` = lines only); "
          "`mixedD`: the default square (`REFINE_CROSS`) plus the mixed re-pack (`agents.mixed_repack`: an AD and an SD batch rebuilt "
          "from scratch, SD at draft depth D; the `improve_mixed` post-step runs `MIXED_DEPTH`); `mixedD_crossC`: the same with square C; "
          "`mixedD_crossC_allpairs`: the same with the AD-only re-pack over every (cap, floor) pair (`agents.ad_prefix_search`, exact bounds; "
          "the `improve_mixed_all_pairs` post-step) instead of its grid; "
          "`every_pair_ad`: the AD-only re-pack at every (cap, floor) pair of the round. Validation stream "
          f"(seed {ImitationConfig().val_seed}), never test; BALANCE at gamma 4. `cpu_ms_median`: the post-step alone, one thread; "
          "`decision_cpu_ms_median`: the policy's own plan plus the post-step; `balance_over_decision`: BALANCE's CPU time per round over that "
          "(medians over the rounds; the speed target is >= 100x at K = 200).", "",
          summary.to_markdown(index=False, floatfmt=".4g"), "",
          f"1-minute load average {os.getloadavg()[0]:.1f} at the end ({os.cpu_count()} CPUs).", "",
          f"Reproduce: `python -m experiments.improve_tuning --ks {args.ks} --rounds {args.rounds} --crosses {args.crosses} "
          f"--mixed-depths {args.mixed_depths}" + (f" --mixed-crosses {args.mixed_crosses}" if mixed_crosses else "")
          + (f" --all-pairs-crosses {args.all_pairs_crosses}" if all_pairs else "") + f" --out {args.out}`", ""]
    write_text_atomic(args.out / "improve_tuning.md", "\n".join(md))
    print(summary.to_string(index=False))


if __name__ == "__main__":
    main()
