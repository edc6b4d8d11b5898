"""The scorecard of ``experiments.specedge``: its results against SpecEdge's published figures.

SpecEdge (NeurIPS 2025) reports 2.22x server throughput and -11.24 % inter-token latency (ITL)
against server-only tree speculative decoding, tree drafts, ~15 ms RTT. This module turns the
experiment's rows into the markdown that says what matches and what does not: per client count,
under each setting of the three engine switches read from SpecEdge's code (``envs.split_cost``,
"SpecEdge's engines"), with what the code establishes about the server-only baseline and, where the
model cannot reach the published pair, the arithmetic of why; and it draws the experiment's figure.

Every number it prints comes from the rows it is given (``specedge.csv``, ``specedge_engines.csv``);
only the published figures and the code facts are constants here.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

HEADLINE_RTT_MS = 15.0
HEADLINE_CLIENTS = 2  #: two pipelined cohorts of 1: server batch 1 (SpecEdge's example config, ``max_batch_size: 1``, two clients)
SWEEP_CLIENTS = 16  #: the client count of the RTT and ablation tables besides the headline's (server batch 8)
PUBLISHED = {"throughput_ratio": 2.22, "itl_change": -0.1124}  #: SpecEdge (NeurIPS 2025), its setting
PUBLISHED_PROACTIVE_TOKENS = 0.1321  #: proactive drafting's tokens per verify, second-hand (Fig. 9)
PUBLISHED_PIPELINE = 2.07  #: pipeline-aware scheduling's throughput factor, second-hand
PUBLISHED_EDGE_LEVEL_MS = 11.0  #: one 32-wide Qwen3-1.7B draft level on an RTX 4090, second-hand (the depth example)
TARGET_BAND = 0.20  #: the issue's tolerance on the published figures
#: where the sources put the headline's batch (second-hand: configurations, not the paper's text)
HEADLINE_BATCH_NOTE = ("The sources place the headline at server batch 1: SpecEdge's example config (`max_batch_size: 1`, two clients) and both "
                       "reproductions that state it (`ymdxe/fastsd` `baselines/specedge/configs/qwen3-14b-1p7b-*.yaml`: batch 1, two clients, "
                       "budget 32; `mpieczaba/specedge` `wcss/lib/generate_config.py` `phase_experiments`: Table 1 at batch 1 with two clients, larger batches "
                       "only in a separate batch-size phase). "
                       "So a match at N = 16 or more is a match at a batch the headline does not use, not a reproduction of it.")

#: what kaist-ina/specedge @ 1edcaf0 establishes about its server-only baseline (read, not run; no code copied)
CODE_FACTS = [
    "**What SpecEdge's code does in its server-only baseline** (`kaist-ina/specedge` @ `1edcaf0`, read, not run):",
    "",
    "- *One process, strictly serialised.* `src/script/server_only.py` `main` loads the draft on `client.device` (the example: `cuda:1`) and the "
    "target on `server.device` (`cuda:0`) and loops: draft (timed `draft_t`), then pre-verify + verify + post-verify (timed `target_t`), both "
    "`util.Timing(mode=\"sync\")`. Nothing overlaps, on one GPU or two; `src/metric/server_only.py` divides the non-prefill tokens by the sum "
    "of `draft_t + target_t` per server iteration (and charges it to one A100). The model's server-only period `draft + verify` is that sum.",
    "- *Draft engine: CUDA graph, padded.* `BatchGraphEngine` (`src/specedge/engine/graph.py`) captures one graph at (`max_batch_size`, "
    "`max_n_beams` = 32); `strategy/edge_draft/specexec.py` `SpecExecEdgeDraft._grow_tree` runs all `max_beam_len` levels (no early stop) "
    "and `_process_candidates` always builds `[max_batch_size, 32]` inputs (padding at slot `max_len - 1`), so every level forwards 32 "
    "tokens per row. Switch `--server-only-widths padded` (the edge's `GraphEngine` instead has one graph per width 1..32 and stops early).",
    "- *Target engine: eager.* Server-only builds its target `BatchGraphEngine(..., use_cuda_graph=False)`; SpecEdge's server "
    "(`strategy/server_verify/specexec/grpc.py` `InferenceController`) replays a graph at (`max_batch_size`, 33). Not a switch: eager "
    "launches run ahead of the GPU unless the host blocks (no synchronising op in the model's forward), so they cost time only where a "
    "layer's host dispatch exceeds its GPU work; our own eager verifier on the H200 took 5.5 ms per call for 6 layers at batch 1 "
    "(`results/gpu_check/verify_timing.md`, repeat), at most ~0.9 ms of host work per layer, under the 14B's ~1.4 ms of GPU work per "
    "layer here (57.5 ms / 40). So eager adds about nothing to this verify (our inference from those two figures).",
    "- *Dense attention.* `model/qwen3.py` `Qwen3Attention._sdpa_attention` attends over all `max_len` = 2048 KV slots of a row "
    "(`model/cache.py` `KVCache.update` returns the whole layer) and materialises the grouped K/V with `repeat_kv` first, in every pass "
    "of both systems. Switch `--dense-attention on` (priced per batch row beyond the first).",
    "- *KV staging.* SpecEdge's server keeps each client's KV outside the engine: per batch `InferenceController._inference` zeroes the "
    "batch cache and copies every client's whole 2048-slot KV in, and `_reorder_kv_cache` compacts the accepted path and copies the row back "
    "out; server-only SD's KV stays in its engines and is only compacted (`SpecExecEdgeVerify._reorder_by_sequence`, both models). Switch "
    "`--kv-staging on` (per row beyond the first; it costs SpecEdge more than server-only).",
    "- *Tree.* Budget 32, 32 beams, 16 children, depth `max_beam_len` (the server-only example config has budget 64; the paper tuned the "
    "baseline's depth over 2-8; we use budget 32 on both sides). Both intervals also hold host-side tree work the model does not price (no "
    "measured figure): per level a top-k over `max_len`, dense `[B, 32, max_len]` mask-row gathers, log-softmax and top-16 over the vocabulary "
    "and boolean selections that synchronise the host; per iteration the trim (`.item()` per row, dense tree and KV gathers), "
    "`edge_pre_verify` and `edge_post_verify` (acceptance over dense ancestor rows, KV compaction of *both* models per row). The edge pays "
    "its own share of this, hidden behind the other cohort's verify whenever its iteration is the shorter.",
    "",
]


def verdict(value: float, target: float, percent: bool = False) -> str:
    """Whether ``value`` lies within +-TARGET_BAND (relative) of the published ``target``, with the band."""
    lo, hi = sorted((target * (1 - TARGET_BAND), target * (1 + TARGET_BAND)))
    fmt = (lambda v: f"{v:+.1%}") if percent else (lambda v: f"{v:.2f}x")
    inside = lo <= value <= hi
    return f"{'within' if inside else 'outside'} the +-{TARGET_BAND:.0%} band [{fmt(lo)}, {fmt(hi)}]"


def _mark(ok: bool) -> str:
    return "matches" if ok else "does not match"


def published_implies(h: pd.Series) -> list[str]:
    """What 2.22x needs of the server-only draft at ``h``'s batch, against what the model and the hardware give (same_batch only)."""
    cols = ("baseline_tokens_per_iteration", "baseline_verify_ms", "baseline_draft_ms", "baseline_depth", "baseline_batch")
    if any(c not in h or pd.isna(h[c]) for c in cols):
        return []
    depth, batch, verify = int(h["baseline_depth"]), int(h["baseline_batch"]), float(h["baseline_verify_ms"])
    # the server-only iteration that would make this row's ratio 2.22x: T = 2.22 * B * E / SpecEdge's throughput
    need_t = PUBLISHED["throughput_ratio"] * batch * h["baseline_tokens_per_iteration"] / h["specedge_throughput_tok_s"] * 1e3
    need = need_t - verify
    out = [f"- what 2.22x needs here: server-only SD (batch {batch}, depth {depth}) taking {need_t:.0f} ms per iteration, i.e. {need:.0f} ms of "
           f"draft passes ({need / depth:.1f} ms per level) besides its {verify:.0f} ms verify; the model prices them at {h['baseline_draft_ms']:.0f} ms "
           f"({h['baseline_draft_ms'] / depth:.1f} ms per level)"]
    # the most favourable SpecEdge: no pipeline bubble (T = 2 V) and the published proactive gain (E_SE = 1.1321 E_SO)
    best = (PUBLISHED["throughput_ratio"] / (1 + PUBLISHED_PROACTIVE_TOKENS) - 1) * verify
    out.append(f"- even for the most favourable SpecEdge (no pipeline bubble, T = 2 V; the published +13.21 % proactive tokens) 2.22x needs "
               f"{best:.0f} ms of server-only draft passes ({best / depth:.1f} ms per level): ratio = (1 + proactive gain) x T_so / V")
    if "baseline_level_roofline_ms" in h and not pd.isna(h["baseline_level_roofline_ms"]):
        out.append(f"- what the hardware permits per 32-wide level: the A100's roofline (weights and KV at its bandwidth, no overhead) "
                   f"{h['baseline_level_roofline_ms']:.1f} ms; the model {h['baseline_draft_ms'] / depth:.1f} ms (the draft engine's overhead fitted on "
                   f"the RTX 4090); the same engine on the RTX 4090 {h['edge_level_ms']:.1f} ms (SpecEdge's ~{PUBLISHED_EDGE_LEVEL_MS:g} ms). "
                   f"The A100 has 1.54x the 4090's bandwidth and 1.9x its FLOP/s, so a level can cost more on it only if it is bound by host work "
                   "and the server's host is the slower one -- nothing in the code or the published setup says so")
        # the upper bound: the 4090's whole level paid on the A100 too (all host work); SpecEdge unchanged, so the ratio scales with T_so
        t_so = verify + h["baseline_draft_ms"]
        upper = h["throughput_ratio"] * (verify + depth * h["edge_level_ms"]) / t_so
        out.append(f"- upper bound: were the RTX 4090's whole {h['edge_level_ms']:.1f} ms level host work, paid in full on the A100 as well, "
                   f"server-only SD would take {verify + depth * h['edge_level_ms']:.0f} ms per iteration and the ratio would be {upper:.2f}x "
                   f"({verdict(upper, PUBLISHED['throughput_ratio'])}; ITL change {2 / upper - 1:+.1%}, outside its band): at server batch 1 "
                   "no draft cost the hardware permits puts SpecEdge's ITL below server-only's, let alone at -11.24 %")
    return out


def scorecard(tp: pd.DataFrame, n: int) -> list[str]:
    """What matches SpecEdge's published findings at ``n`` clients (tree drafts, the run's switch setting)."""
    full = tp[(tp["variant"] == "full") & (tp["draft"] == "tree") & (tp["num_clients"] == n)].sort_values("rtt_ms")
    at15 = tp[(tp["draft"] == "tree") & (tp["num_clients"] == n) & (tp["rtt_ms"] == HEADLINE_RTT_MS)].set_index("variant")
    if full.empty or "full" not in at15.index:
        return []
    h = at15.loc["full"]
    out = [f"**Scorecard at N = {n}** (server batch {int(h['server_batch'])}; tree drafts; published figures from the paper; "
           "those marked second-hand are quoted by the project's SpecEdge notes, not read in the paper itself):", ""]
    ratio_ok = abs(h["throughput_ratio"] / PUBLISHED["throughput_ratio"] - 1) <= TARGET_BAND
    itl_ok = abs(h["itl_change"] / PUBLISHED["itl_change"] - 1) <= TARGET_BAND
    out.append(f"- 2.22x server throughput at ~15 ms: {h['throughput_ratio']:.2f}x, {_mark(ratio_ok)} within +-20 %;")
    out.append(f"- -11.24 % ITL: {h['itl_change']:+.1%}, {_mark(itl_ok)} within +-20 %"
               + (" (SpecEdge's ITL is *higher* than server-only's here)" if h["itl_change"] > 0 else "") + ";")
    r = full["throughput_ratio"].to_numpy()
    falls = bool(np.all(np.diff(r) <= 1e-9)) and r[-1] < r[0] * (1 - 1e-6)
    out.append(f"- the gain falls as RTT grows: {r[0]:.2f}x at {full['rtt_ms'].iloc[0]:g} ms -> {r[-1]:.2f}x at {full['rtt_ms'].iloc[-1]:g} ms, "
               f"{_mark(falls)}" + ("" if falls else " (flat: the server is the bottleneck, every RTT hides behind the other cohort's verify)") + ";")
    below = full[full["itl_change"] < 0]["rtt_ms"]
    out.append("- ITL below server-only's up to ~50 ms RTT, ~+22 % at 65 ms (second-hand): "
               + (f"below up to {below.max():g} ms" if not below.empty else "never below at any RTT")
               + f", {full['itl_change'].iloc[-1]:+.0%} at {full['rtt_ms'].iloc[-1]:g} ms;")
    if {"no_proactive", "no_pipeline"} <= set(at15.index):
        pro = h["specedge_tokens_per_iteration"] / at15.loc["no_proactive", "specedge_tokens_per_iteration"] - 1
        pipe = h["specedge_throughput_tok_s"] / at15.loc["no_pipeline", "specedge_throughput_tok_s"]
        out.append(f"- proactive drafting +13.21 % tokens per verify (second-hand): {pro:+.1%}, "
                   f"{_mark(abs(pro / PUBLISHED_PROACTIVE_TOKENS - 1) <= TARGET_BAND)} within +-20 %;")
        out.append(f"- pipeline-aware scheduling 2.07x throughput (second-hand): {pipe:.2f}x, {_mark(abs(pipe / PUBLISHED_PIPELINE - 1) <= TARGET_BAND)} "
                   "within +-20 %.")
    return out + [""]


def engine_table(engines: pd.DataFrame) -> list[str]:
    """The headline (tree, full, 15 ms) under each setting of the engine switches, per client count."""
    if engines is None or engines.empty:
        return []
    t = engines.copy()
    t["matches_2.22x"] = (t["throughput_ratio"] / PUBLISHED["throughput_ratio"] - 1).abs() <= TARGET_BAND
    t["matches_-11.24%"] = (t["itl_change"] / PUBLISHED["itl_change"] - 1).abs() <= TARGET_BAND
    t["so_level_ms"] = t["baseline_draft_ms"] / t["baseline_depth"]
    cols = ["server_only_widths", "dense_attention", "kv_staging", "num_clients", "server_batch", "depth", "specedge_verify_ms", "baseline_depth", "so_level_ms",
            "baseline_verify_ms", "throughput_ratio", "itl_change", "matches_2.22x", "matches_-11.24%"]
    matched = t[t["matches_2.22x"] & t["matches_-11.24%"]]
    full = t[(t["server_only_widths"] == "padded") & t["dense_attention"].astype(bool) & t["kv_staging"].astype(bool)]
    if full.empty:
        code = ""
    elif (full["matches_2.22x"] & full["matches_-11.24%"]).any():
        code = " With all three (everything the code does) both figures are matched at N = " + ", ".join(
            str(int(n)) for n in full[full["matches_2.22x"] & full["matches_-11.24%"]]["num_clients"]) + "."
    else:
        b = full.loc[full["itl_change"].idxmin()]
        code = (f" With all three (everything the code does) no N matches both: the lowest ITL change is {b['itl_change']:+.1%} "
                f"(N = {int(b['num_clients'])}, ratio {b['throughput_ratio']:.2f}x); the matches above need the KV staging left out, "
                "which the code does not do.")
    n2 = t[t["num_clients"] == t["num_clients"].min()]["throughput_ratio"]
    spread = float(n2.max() / n2.min() - 1) if not n2.empty else 0.0
    where = ("; ".join(f"{w} widths, dense attention {'on' if d else 'off'}, KV staging {'on' if k else 'off'}: N = "
                       f"{', '.join(str(int(n)) for n in g['num_clients'])}"
                       for (w, d, k), g in matched.groupby(["server_only_widths", "dense_attention", "kv_staging"])) or "no setting")
    return [f"**The engine switches** (tree, full system, {HEADLINE_RTT_MS:g} ms; `specedge_engines.csv`). `so_level_ms`: one server-only draft "
            "level; `specedge_verify_ms` / `baseline_verify_ms`: the two systems' verify pass. No switch acts at server batch 1 (a 32-wide "
            "level is weight-bound there; the dense and staging terms are priced per row beyond the first), so the smallest N's ratio is the same "
            "under every setting "
            f"to {spread * 100:.3f} %. Both published figures are matched within +-20 % by {where}.{code} The run's default is all three on, because all three are what SpecEdge's code does "
            "(the code facts above), including the one that works against SpecEdge (KV staging); the parameters are its `max_len` and the models' "
            "shapes at the A100's bandwidth, nothing fitted to 2.22x. "
            + HEADLINE_BATCH_NOTE, "",
            t[cols].to_markdown(index=False, floatfmt=".3g"), ""]


def run_setting(tp: pd.DataFrame) -> tuple[str, str, str]:
    """The run's baseline, tree profile and proactive gain (from the CSV's columns; older CSVs: the earlier method)."""
    first = tp.iloc[0]
    baseline = str(first["baseline"]) if "baseline" in tp else "equal_itl"
    gain = str(first["proactive_gain"]) if "proactive_gain" in tp else "time"
    tree = tp[tp["draft"] == "tree"]
    return baseline, (str(tree["profile"].iloc[0]) if not tree.empty else "-"), gain


def figure(tp: pd.DataFrame, summary: pd.DataFrame | None):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    full = tp[(tp["variant"] == "full") & (tp["num_clients"] == HEADLINE_CLIENTS)]
    for draft, g in full.groupby("draft"):
        g = g.sort_values("rtt_ms")
        axes[0].plot(g["rtt_ms"], g["throughput_ratio"], marker="o", label=f"{draft} (full)")
    for variant in ("fixed_depth", "no_proactive", "no_pipeline"):
        g = tp[(tp["variant"] == variant) & (tp["num_clients"] == HEADLINE_CLIENTS) & (tp["draft"] == "tree")].sort_values("rtt_ms")
        if not g.empty:
            axes[0].plot(g["rtt_ms"], g["throughput_ratio"], ls="--", label=f"tree ({variant})")
    axes[0].axhline(PUBLISHED["throughput_ratio"], color="k", lw=0.8, ls=":", label="published 2.22x (tree, 15 ms)")
    axes[0].axhline(1.0, color="grey", lw=0.5)
    g = tp[(tp["variant"] == "full") & (tp["num_clients"] == SWEEP_CLIENTS) & (tp["draft"] == "tree")].sort_values("rtt_ms")
    if not g.empty:
        axes[0].plot(g["rtt_ms"], g["throughput_ratio"], ls="-.", marker="x", label=f"tree (full, N = {SWEEP_CLIENTS})")
    baseline = run_setting(tp)[0]
    axes[0].set(xlabel="RTT (ms)", ylabel=f"server throughput ratio ({baseline})", title=f"SpecEdge / server-only SD, N = {HEADLINE_CLIENTS}")
    axes[0].legend(fontsize=7)
    for draft, g in full.groupby("draft"):
        g = g.sort_values("rtt_ms")
        axes[1].plot(g["rtt_ms"], 100 * g["itl_change"], marker="o", label=draft)
    axes[1].axhline(100 * PUBLISHED["itl_change"], color="k", lw=0.8, ls=":", label="published -11.24 %")
    axes[1].axhline(0.0, color="grey", lw=0.5)
    axes[1].set(xlabel="RTT (ms)", ylabel="ITL change vs server-only (%)", title="Inter-token latency")
    axes[1].legend(fontsize=7)
    if summary is not None and not summary.empty:
        for frac, g in summary.groupby("edge_fraction"):
            g = g.sort_values("num_users")
            axes[2].plot(g["num_users"], g["balance_ed_served"] / g["num_users"], marker="o", label=f"balance_ed, edge {frac:g}")
        b = summary.groupby("num_users")["balance_served"].first()
        axes[2].plot(b.index, b / b.index, color="k", marker="s", label="balance (AD/SD)")
        axes[2].set(xlabel="K (users per round)", ylabel="served fraction", title="Hybrid: BALANCE with ED")
        axes[2].legend(fontsize=7)
    else:
        axes[2].axis("off")
    fig.tight_layout()
    return fig
