"""SpecEdge's engine costs beyond the roofline, read from its code (``kaist-ina/specedge`` @ ``1edcaf0``).

Three switches of ``envs.split_cost.SplitOptions``, all off by default (the v1 environment is unchanged);
``experiments.specedge`` turns all three on, because all three are what SpecEdge's code does. Bytes
are priced at the pass's device bandwidth times its roofline bandwidth efficiency, for **every batch
row beyond the first**: the batch-1 pass times are taken as given (the timed profile fits them to
SpecEdge's published batch-1 timings, which already contain these costs), so the switches price how
SpecEdge's passes grow with the batch. Roofline latencies only (a measured table has no bandwidth).

* ``server_only_widths="padded"``: SpecEdge's server-only baseline (``src/script/server_only.py``)
  drafts with ``strategy/edge_draft/specexec.py`` ``SpecExecEdgeDraft._grow_tree``, which runs all
  ``max_beam_len`` levels (no early stop) and whose ``_process_candidates`` always builds
  ``[max_batch_size, max_n_beams]`` inputs (padding at the junk slot ``max_len - 1``), replayed by
  the one CUDA graph ``engine/graph.py`` ``BatchGraphEngine`` captures at ``(max_batch_size,
  max_n_beams)``. So every one of the ``depth`` levels forwards ``beams`` tokens per row:
  ``T = sum_{l<=depth} tau_S(b, beams, c_l) + verify``, the context still growing by the kept
  tree's real nodes. ``"tree"`` (default) prices the tree's own widths, as on the edge.
* ``dense_attention_len=L`` (SpecEdge: ``max_len`` 2048): ``model/qwen3.py``
  ``Qwen3Attention._sdpa_attention`` attends over every one of a row's ``L`` KV slots
  (``model/cache.py`` ``KVCache.update`` returns the whole layer) and materialises the grouped
  K/V with ``repeat_kv`` before SDPA. Per row and pass that moves
  ``layers * 2 * L * head_dim * dtype * (kv_heads + 2 heads)`` bytes (read K/V, write and re-read
  the expanded copy; ``kv_heads`` only when ``heads == kv_heads``, where ``repeat_kv`` is a no-op)
  instead of the roofline's ``c * kv_bytes_per_token``, on every pass of both systems (draft and
  verify; the edge drafts at batch 1, where it is in the fitted pass time).
* ``kv_staging_len=L`` (SpecEdge: 2048): the KV bookkeeping around each verify, at the target's
  device bandwidth. SpecEdge's server
  (``strategy/server_verify/specexec/grpc.py`` ``InferenceController._inference`` and
  ``_reorder_kv_cache``) zeroes the batch cache, copies each client's whole ``L``-slot KV in,
  compacts the accepted path (``model/cache.py`` ``KVCache.gather``: the kept ``c`` slots moved,
  the tail zeroed) and copies the row back out: ``kv_L * (6 L + c)`` bytes per row. Server-only SD
  (``strategy/edge_verify/specexec.py`` ``SpecExecEdgeVerify._reorder_by_sequence``) only compacts,
  both models' caches: ``(kv_L + kv_S) * (L + c)`` per row. This one works against SpecEdge.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from envs.draft_tree import DraftTree, TreeShape
from envs.hardware_specs import ModelSpec

if TYPE_CHECKING:
    from envs.latency import LatencyModel

SERVER_ONLY_WIDTHS = ("tree", "padded")
SPECEDGE_MAX_LEN = 2048  #: SpecEdge's ``max_len`` (KV slots per row; its configs' ``base.max_len``)


def padded_levels(shape: TreeShape, tree: DraftTree) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Server-only widths and real nodes per level under ``"padded"``: ``tree.beams`` at each of ``tree.max_depth`` levels."""
    levels = tree.max_depth
    nodes = tuple(shape.level_nodes[:levels]) + (0,) * (levels - len(shape.level_nodes))
    return (tree.beams,) * levels, nodes


def dense_attention_bytes(model: ModelSpec, span: int, context: float) -> float:
    """Bytes one row's pass moves beyond the roofline's KV read under dense attention over ``span`` slots."""
    heads = model.kv_heads if model.heads == model.kv_heads else model.kv_heads + 2 * model.heads  # repeat_kv copies only under GQA
    dense = model.layers * 2.0 * span * model.head_dim * model.dtype_bytes * heads
    return max(dense - context * model.kv_bytes_per_token, 0.0)  # the roofline already reads the context's KV once


def kv_staging_bytes(kv_llm: float, kv_slm: float, span: int, context: float, server_only: bool) -> float:
    """Bytes of one row's KV bookkeeping per verify: SpecEdge's ``kv_L (6 L + c)``; server-only's ``(kv_L + kv_S)(L + c)``."""
    c = min(float(context), float(span))
    return (kv_llm + kv_slm) * (span + c) if server_only else kv_llm * (6.0 * span + c)


def extra_rows_s(latency: LatencyModel, b: int, per_row_bytes: float, option: str, profile: str) -> float:
    """Seconds of ``per_row_bytes`` for each of the ``b - 1`` rows beyond the first on ``latency``'s roofline (0 if ``b <= 1``)."""
    if b <= 1:
        return 0.0
    if not hasattr(latency, "bandwidth_efficiency") or getattr(latency, "model", None) is None:
        raise ValueError(f"split option {option!r} needs roofline latencies; profile {profile!r} has {type(latency).__name__}")
    return (b - 1) * per_row_bytes / (latency.bandwidth_efficiency * latency.device.bandwidth_bytes_per_s)
