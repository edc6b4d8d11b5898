"""Part 1 of ``experiments.specedge``: SpecEdge against server-only SD in the closed form, row by row.

For each draft (chain / tree), variant (``full`` and the ablations ``fixed_depth``,
``no_proactive``, ``no_pipeline``), RTT and client count, :func:`throughput_rows` prices SpecEdge's
steady state with ``envs.split_cost.SplitCostModel`` and compares it with the chosen server-only
baseline (``same_batch`` or ``equal_itl``; :func:`server_only_frontier`, :func:`best_at_batch`,
:func:`best_at_itl`). :func:`sensitivity_rows` and :func:`engine_rows` rerun the headline under
each tree timing / proactive gain and each setting of SpecEdge's engine switches.

Separate from the experiment's driver and report (:mod:`experiments.specedge`: the CLI, the
hybrid part, the markdown): this module holds the setting (constants) and the measurement, and
writes nothing. The methods are described in :mod:`experiments.specedge`'s docstring.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from envs.profile import load_profile
from envs.split_cost import (
    PROACTIVE_GAINS,
    SERVER_ONLY_WIDTHS,
    SPECEDGE_MAX_LEN,
    DraftTree,
    SplitCostModel,
    SplitOptions,
)
from experiments.specedge_hybrid import HYBRID_PROFILE
from experiments.specedge_scorecard import HEADLINE_CLIENTS, HEADLINE_RTT_MS

ALPHA = 0.8
PROMPT_TOKENS, OUTPUT_TOKENS = 512, 256
CONTEXT = PROMPT_TOKENS + OUTPUT_TOKENS / 2.0  #: a client's mean context over its request
CONTEXT_MAX = float(PROMPT_TOKENS + OUTPUT_TOKENS)
MAX_DEPTH = 8
FIXED_DEPTH = 4
BASELINES = ("same_batch", "equal_itl")
SAME_BATCH_DEPTHS = range(2, 9)  #: SpecEdge tuned the server-only depth over 2-8
TREE_PROFILES = {"timed": "split_a100-40gb_qwen3-14b_qwen3-1.7b_timed", "roofline": "split_a100-40gb_qwen3-14b_qwen3-1.7b"}
#: (server_only_widths, dense_attention, kv_staging): all off, each alone, the two that favour SpecEdge, all three (the default)
ENGINE_SETTINGS = (("tree", False, False), ("padded", False, False), ("tree", True, False), ("tree", False, True), ("padded", True, False),
                   ("padded", True, True))
ENGINE_CLIENTS = (2, 4, 8, 16, 32)  #: client counts of the engine-switch table
DRAFTS = {
    "chain": (HYBRID_PROFILE, DraftTree.chain(FIXED_DEPTH)),  # the hybrid (part 2) runs on the chain drafts' profile
    "tree": (TREE_PROFILES["timed"], DraftTree(budget=32, beams=32, branch=16, depth=FIXED_DEPTH)),
}
VARIANTS = {
    "full": dict(proactive=True, pipeline=True, calibrated=True),
    "fixed_depth": dict(proactive=True, pipeline=True, calibrated=False),
    "no_proactive": dict(proactive=False, pipeline=True, calibrated=True),
    "no_pipeline": dict(proactive=True, pipeline=False, calibrated=True),
}


def with_depth(tree: DraftTree, depth: int) -> DraftTree:
    """``tree`` at draft depth ``depth`` (a chain stays a chain)."""
    return DraftTree.chain(depth) if tree.is_chain else DraftTree(tree.budget, tree.beams, tree.branch, depth)


def server_only_frontier(model: SplitCostModel, tree: DraftTree) -> pd.DataFrame:
    """Every server-only operating point that fits the server: (batch, depth, ITL, throughput)."""
    rows = []
    for depth in range(1, MAX_DEPTH + 1):
        shape = with_depth(tree, depth)
        for b in range(1, 513):
            s = model.server_only(b, ALPHA, shape, CONTEXT, context_max=CONTEXT_MAX)
            if not s.fits_memory:
                break
            rows.append({"batch": b, "depth": depth, "itl_s": s.itl_s, "throughput_tok_s": s.throughput_tok_s})
    return pd.DataFrame(rows)


def best_at_itl(frontier: pd.DataFrame, itl_s: float) -> pd.Series | None:
    """The server-only point with the most throughput whose ITL is no larger than ``itl_s``."""
    ok = frontier[frontier["itl_s"] <= itl_s * (1 + 1e-12)]
    return None if ok.empty else ok.loc[ok["throughput_tok_s"].idxmax()]


def best_at_batch(frontier: pd.DataFrame, batch: int) -> pd.Series | None:
    """Server-only SD at ``batch`` with the depth (2..8) of most throughput (SpecEdge's tuned baseline)."""
    ok = frontier[(frontier["batch"] == batch) & frontier["depth"].isin(list(SAME_BATCH_DEPTHS))]
    return None if ok.empty else ok.loc[ok["throughput_tok_s"].idxmax()]


def engine_options(server_only_widths: str = "padded", dense_attention: bool = True, kv_staging: bool = True) -> dict:
    """SplitOptions fields of SpecEdge's engines (``envs.split_cost``, "SpecEdge's engines"); the defaults are its code's."""
    if server_only_widths not in SERVER_ONLY_WIDTHS:
        raise ValueError(f"server_only_widths must be one of {list(SERVER_ONLY_WIDTHS)}, got {server_only_widths!r}")
    return {"server_only_widths": server_only_widths, "dense_attention_len": SPECEDGE_MAX_LEN if dense_attention else None,
            "kv_staging_len": SPECEDGE_MAX_LEN if kv_staging else None}


def throughput_rows(rtts_ms: list[float], clients: list[int], drafts: list[str], baseline: str = "same_batch", tree_timing: str = "timed",
                    proactive_gain: str = "tokens", server_only_widths: str = "padded", dense_attention: bool = True,
                    kv_staging: bool = True) -> pd.DataFrame:
    """Part 1: one row per draft, variant, RTT and client count (module docstring: ``baseline``, ``tree_timing``, ``proactive_gain``,
    ``server_only_widths``, ``dense_attention``, ``kv_staging``)."""
    engines = engine_options(server_only_widths, dense_attention, kv_staging)
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {list(BASELINES)}, got {baseline!r}")
    if tree_timing not in TREE_PROFILES:
        raise ValueError(f"tree_timing must be one of {list(TREE_PROFILES)}, got {tree_timing!r}")
    rows = []
    for draft in drafts:
        profile_name, tree = DRAFTS[draft]
        if draft == "tree":
            profile_name = TREE_PROFILES[tree_timing]
        profile = load_profile(profile_name)
        base_model = SplitCostModel(profile, SplitOptions(**engines))
        frontier = server_only_frontier(base_model, tree)
        for variant, v in VARIANTS.items():
            model = SplitCostModel(profile, SplitOptions(proactive=v["proactive"], pipeline=v["pipeline"], proactive_gain=proactive_gain,
                                                          **engines))
            for rtt in rtts_ms:
                for n in clients:
                    # without pipelining SpecEdge's ablation keeps the server batch and drops the second
                    # client per batch slot (same_batch: ceil(N / 2) clients, one cohort); equal_itl keeps N
                    active = n if (v["pipeline"] or baseline == "equal_itl") else max(1, -(-n // 2))
                    batch = max(1, -(-n // 2)) if v["pipeline"] else active
                    depth = (model.calibrated_depth(ALPHA, CONTEXT, rtt / 1e3, verify_clients=batch, max_depth=MAX_DEPTH,
                                                    tree=None if tree.is_chain else tree)
                             if v["calibrated"] else FIXED_DEPTH)
                    shape = with_depth(tree, int(depth))
                    e = model.steady_state(active, ALPHA, shape, CONTEXT, rtt_s=rtt / 1e3, context_max=CONTEXT_MAX)
                    same_n = base_model.server_only(n, ALPHA, shape, CONTEXT, context_max=CONTEXT_MAX)
                    if baseline == "same_batch":
                        # server-only at SpecEdge's server batch (ceil(N / 2): two clients per batch slot)
                        best = best_at_batch(frontier, max(1, -(-n // 2)))
                        ref_itl = None if best is None else best["itl_s"]
                    else:
                        best = best_at_itl(frontier, e.itl_s)
                        ref_itl = same_n.itl_s
                    if best is not None:  # the baseline's iteration split into its draft passes and its verify pass
                        b_shape = with_depth(tree, int(best["depth"]))
                        b_ss = base_model.server_only(int(best["batch"]), ALPHA, b_shape, CONTEXT, context_max=CONTEXT_MAX)
                        b_verify = base_model.server_only_verify_s(int(best["batch"]), b_shape, CONTEXT)
                        width = b_shape.beams  # one full-width level: the A100's device floor and the edge's pass
                        level_floor = (base_model.tau_s.tau1(int(best["batch"]), width, CONTEXT + width)
                                       - profile.slm.layers * getattr(base_model.tau_s, "layer_overhead_s", 0.0))
                        edge_level = base_model.tau_e.tau1(1, width, CONTEXT + width)
                    rows.append({
                        "draft": draft, "variant": variant, "rtt_ms": rtt, "num_clients": n, "edge_clients": active, "server_batch": batch, "depth": int(depth),
                        "profile": profile_name, "baseline": baseline, "proactive_gain": proactive_gain,
                        "server_only_widths": server_only_widths, "dense_attention": bool(dense_attention), "kv_staging": bool(kv_staging),
                        "specedge_itl_ms": e.itl_s * 1e3, "specedge_throughput_tok_s": e.throughput_tok_s, "specedge_server_busy": e.server_busy,
                        "specedge_tokens_per_iteration": e.tokens_per_iteration, "specedge_verify_ms": e.verify_s[0] * 1e3,
                        "specedge_edge_ms": e.edge_s[0] * 1e3 if e.edge_s else np.nan, "specedge_fits_memory": e.fits_memory,
                        "server_only_itl_ms": same_n.itl_s * 1e3, "server_only_throughput_tok_s": same_n.throughput_tok_s,
                        "server_only_fits_memory": same_n.fits_memory,
                        "baseline_batch": np.nan if best is None else int(best["batch"]), "baseline_depth": np.nan if best is None else int(best["depth"]),
                        "baseline_itl_ms": np.nan if best is None else best["itl_s"] * 1e3,
                        "baseline_throughput_tok_s": np.nan if best is None else best["throughput_tok_s"],
                        "baseline_tokens_per_iteration": np.nan if best is None else b_ss.tokens_per_iteration,
                        "baseline_verify_ms": np.nan if best is None else b_verify * 1e3,
                        "baseline_draft_ms": np.nan if best is None else (b_ss.iteration_s - b_verify) * 1e3,
                        "baseline_level_roofline_ms": np.nan if best is None else level_floor * 1e3,
                        "edge_level_ms": np.nan if best is None else edge_level * 1e3,
                        "throughput_ratio": np.nan if best is None else e.throughput_tok_s / best["throughput_tok_s"],
                        "itl_change": np.nan if ref_itl is None else e.itl_s / ref_itl - 1.0,
                        "headline": variant == "full" and draft == "tree" and rtt == HEADLINE_RTT_MS and n == HEADLINE_CLIENTS,
                    })
    return pd.DataFrame(rows)


def sensitivity_rows(baseline: str = "same_batch", **engines) -> pd.DataFrame:
    """The headline row (tree, full, 15 ms, N = HEADLINE_CLIENTS) under every tree timing and proactive gain."""
    rows = []
    for timing in TREE_PROFILES:
        for gain in PROACTIVE_GAINS:
            tp = throughput_rows([HEADLINE_RTT_MS], [HEADLINE_CLIENTS], ["tree"], baseline=baseline, tree_timing=timing, proactive_gain=gain,
                                 **engines)
            h = tp[tp["headline"]].iloc[0]
            rows.append({"tree_timing": timing, "proactive_gain": gain, **{k: h[k] for k in (
                "profile", "baseline", "depth", "specedge_verify_ms", "specedge_edge_ms", "specedge_tokens_per_iteration", "baseline_depth",
                "baseline_verify_ms", "baseline_draft_ms", "throughput_ratio", "itl_change")}})
    return pd.DataFrame(rows)


def engine_rows(baseline: str = "same_batch", proactive_gain: str = "tokens") -> pd.DataFrame:
    """The headline (tree, full, 15 ms) at ENGINE_CLIENTS under every setting of the two engine switches (``envs.split_cost``)."""
    keep = ("num_clients", "server_batch", "depth", "specedge_verify_ms", "specedge_edge_ms", "specedge_tokens_per_iteration", "baseline_depth",
            "baseline_draft_ms", "baseline_verify_ms", "throughput_ratio", "itl_change")
    rows = []
    for widths, dense, staging in ENGINE_SETTINGS:
        tp = throughput_rows([HEADLINE_RTT_MS], list(ENGINE_CLIENTS), ["tree"], baseline=baseline, proactive_gain=proactive_gain,
                             server_only_widths=widths, dense_attention=dense, kv_staging=staging)
        for _, h in tp[tp["variant"] == "full"].iterrows():
            rows.append({"server_only_widths": widths, "dense_attention": dense, "kv_staging": staging, **{k: h[k] for k in keep}})
    return pd.DataFrame(rows)

