"""Pictures of a round's plan for EdgeSchedule's ``render()``: an ``ansi`` table and an ``rgb_array`` chart.

Both draw a :class:`PlanView` -- a read-only snapshot of one round mid-episode (the users, the
modes decided so far, the batches' aggregates) that the scalar and the vector environment build
the same way -- so rendering never touches the environment's state or its random generator.

The ``rgb_array`` picture is what one wants while debugging a policy: one row per user, grouped by
mode (AD, SD, the current user, users still to come, rejected). An admitted user's row shows its
timeline from the round's start: uplink (light), waiting for the batch's slowest uplink (blank),
compute at its batch's share (AD blue, SD orange), downlink (light); the deadline is a black tick
and a late user's row is outlined in red. Vertical lines mark each batch's end. A side panel shows
the compute shares the batches need and the KV memory they hold against the budget. Latencies are
the ones :func:`envs.outcome.evaluate_plan` gives on the round's realised values with expected
(not sampled) SD acceptance, at the plan's current ``(z, lam)``.

``rgb_array`` needs matplotlib (drawn off-screen with the Agg canvas, no display).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from envs.cost_model import CostModel
from envs.outcome import evaluate_plan
from envs.plan import AD, REJECT, SD, Plan
from envs.workload import Round

FRAME_SIZE_PX = (540, 960)  #: (height, width) of every rgb_array frame
_DPI = 100
_COLORS = {AD: "#1f77b4", SD: "#ff7f0e"}
_LIGHT = {AD: "#aec7e8", SD: "#ffbb78"}


@dataclass(frozen=True)
class PlanView:
    """One round's plan mid-episode. Users are indexed in presentation order unless said otherwise."""

    round: Round | None  #: the round, users in their original order (None before the first reset)
    order: np.ndarray  #: original index of the i-th presented user
    modes: np.ndarray  #: REJECT / AD / SD of each presented user; meaningful for i < t
    t: int  #: users decided so far (the current user's index)
    gamma: int  #: the round's SD draft depth (0 while SD is empty)
    z: float  #: AD's compute share for the plan so far
    lam: float  #: AD's share of the KV budget
    batch_size: tuple[int, int]  #: (AD, SD) users admitted
    share_needed: tuple[float, float]  #: (AD, SD) minimal compute shares
    kv_bytes: tuple[float, float]  #: (AD, SD) KV memory held
    kv_budget_bytes: float  #: KV budget with SD in use (weights and reserve already off)
    mask: tuple[bool, ...]  #: the current user's allowed actions (reject, AD, SD@1..G)

    @property
    def num_users(self) -> int:
        return len(self.order)

    def original_modes(self) -> np.ndarray:
        """Modes in the round's original order; undecided users are REJECT."""
        modes = np.full(self.num_users, REJECT, dtype=np.int8)
        decided = self.order[: self.t]
        modes[decided] = self.modes[: self.t]
        return modes


def render_ansi(view: PlanView) -> str:
    """A text view: the batches, the current mask, and one line per user in presentation order."""
    k = view.num_users
    lines = [
        f"user {view.t}/{k}  gamma={view.gamma}  z={view.z:.3f}  lam={view.lam:.3f}",
        f"AD: {view.batch_size[0]} users, share needed {view.share_needed[0]:.3f}, KV {view.kv_bytes[0] / 1e9:.2f} GB",
        f"SD: {view.batch_size[1]} users, share needed {view.share_needed[1]:.3f}, KV {view.kv_bytes[1] / 1e9:.2f} GB",
        "mask: " + "".join("1" if m else "0" for m in view.mask),
    ]
    if view.round is None:
        return "\n".join(lines) + "\n"
    rnd = view.round
    lines.append(f"{'#':>4} {'user':>4} {'in':>5} {'out':>5} {'alpha':>5} {'up_s':>6} {'ddl_s':>6} {'mode':>6}")
    names = {REJECT: "reject", AD: "AD", SD: "SD"}
    for i, u in enumerate(view.order.tolist()):
        mode = names[int(view.modes[i])] if i < view.t else ("<- now" if i == view.t else ".")
        lines.append(f"{i:>4} {u:>4} {int(rnd.input_tokens[u]):>5} {int(rnd.output_tokens[u]):>5} {rnd.alpha[u]:>5.2f} "
                     f"{rnd.uplink_s[u]:>6.3f} {rnd.deadline_s[u]:>6.2f} {mode:>6}")
    return "\n".join(lines) + "\n"


def _rows(view: PlanView) -> list[tuple[str, np.ndarray]]:
    """The chart's groups, top to bottom: (label, original user indices)."""
    decided_modes = view.modes[: view.t]
    decided = view.order[: view.t]
    groups = [
        ("AD", decided[decided_modes == AD]),
        ("SD", decided[decided_modes == SD]),
        ("now", view.order[view.t : view.t + 1]),
        ("to come", view.order[view.t + 1 :]),
        ("rejected", decided[decided_modes == REJECT]),
    ]
    return [(label, idx) for label, idx in groups if idx.size]


def render_rgb(view: PlanView, cost: CostModel, completion: str = "batch", sharing: str = "fixed") -> np.ndarray:
    """The plan as a ``FRAME_SIZE_PX + (3,)`` uint8 picture (see the module docstring)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:  # the lean install has no matplotlib
        raise ImportError("render_mode='rgb_array' needs matplotlib (pip install matplotlib)") from err

    height, width = FRAME_SIZE_PX
    fig = Figure(figsize=(width / _DPI, height / _DPI), dpi=_DPI)
    canvas = FigureCanvasAgg(fig)
    grid = fig.add_gridspec(1, 2, width_ratios=(5, 1), left=0.08, right=0.97, top=0.9, bottom=0.1, wspace=0.25)
    ax, side = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])
    k = view.num_users
    fig.suptitle(f"round of {k} users: {view.t} decided, AD {view.batch_size[0]}, SD {view.batch_size[1]}"
                 f" (gamma {view.gamma}), z={view.z:.2f}, lam={view.lam:.2f}", fontsize=10)
    if view.round is not None:
        _draw_timeline(ax, view, cost, completion, sharing)
    _draw_resources(side, view)
    canvas.draw()
    frame = np.asarray(canvas.buffer_rgba())[..., :3].copy()
    if frame.shape[:2] != FRAME_SIZE_PX:  # rounding in the canvas size: keep every frame the same shape
        out = np.full((*FRAME_SIZE_PX, 3), 255, dtype=np.uint8)
        h, w = min(height, frame.shape[0]), min(width, frame.shape[1])
        out[:h, :w] = frame[:h, :w]
        frame = out
    return frame


def _draw_timeline(ax, view: PlanView, cost: CostModel, completion: str, sharing: str) -> None:
    rnd = view.round
    modes = view.original_modes()
    plan = Plan(modes, gamma=max(view.gamma, 1), z=min(max(view.z, 0.0), 1.0), lam=min(max(view.lam, 0.0), 1.0))
    outcome = evaluate_plan(cost, rnd, plan, rng=None, simulate_acceptance=False, completion=completion, sharing=sharing)
    y, ticks, labels = 0.0, [], []
    for label, idx in _rows(view):
        ys = y + np.arange(idx.size)
        ticks.append(y + (idx.size - 1) / 2)
        labels.append(f"{label} ({idx.size})")
        up, ddl = rnd.uplink_s[idx], rnd.deadline_s[idx]
        if label in ("AD", "SD"):
            m = AD if label == "AD" else SD
            lat = outcome.latency_s[idx]
            down = rnd.realized_downlink_s[idx]
            u_batch = float(up.max())
            compute_end = lat - down
            ax.barh(ys, up, left=0.0, height=0.8, color=_LIGHT[m], linewidth=0)
            ax.barh(ys, compute_end - u_batch, left=u_batch, height=0.8, color=_COLORS[m], linewidth=0)
            ax.barh(ys, down, left=compute_end, height=0.8, color=_LIGHT[m], linewidth=0)
            late = ~outcome.served[idx]
            if late.any():
                ax.barh(ys[late], lat[late], left=0.0, height=0.9, fill=False, edgecolor="red", linewidth=1.2)
            end = outcome.ad_batch_s if m == AD else outcome.sd_batch_s
            ax.vlines(u_batch + end, y - 0.5, y + idx.size - 0.5, colors=_COLORS[m], linestyles="dashed", linewidth=1)
        elif label == "now":
            ax.axhspan(y - 0.5, y + 0.5, color="#d5f0d5", linewidth=0)
        elif label == "to come":
            ax.barh(ys, up, left=0.0, height=0.8, color="#d9d9d9", linewidth=0)
        ax.scatter(ddl, ys, marker="|", color="black" if label != "rejected" else "#7f7f7f", s=30, linewidths=1.2, zorder=3)
        ax.axhline(y + idx.size - 0.5, color="#bbbbbb", linewidth=0.6)
        y += idx.size
    ax.set_ylim(y - 0.5, -0.5)
    ax.set_yticks(ticks, labels, fontsize=8)
    ax.set_xlim(0.0, float(rnd.deadline_s.max()) * 1.05)
    ax.set_xlabel("seconds from the round's start (| = deadline)", fontsize=9)
    ax.tick_params(axis="x", labelsize=8)


def _draw_resources(ax, view: PlanView) -> None:
    budget = max(view.kv_budget_bytes, 1.0)
    share = [min(s, 1.0) for s in view.share_needed]
    mem = [min(m / budget, 1.0) for m in view.kv_bytes]
    ax.bar([0, 1], [share[0], mem[0]], color=_COLORS[AD], width=0.6, label="AD")
    ax.bar([0, 1], [share[1], mem[1]], bottom=[share[0], mem[0]], color=_COLORS[SD], width=0.6, label="SD")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([0, 1], ["compute\nshare", "KV\nmemory"], fontsize=8)
    ax.set_ylim(0.0, 1.15)
    ax.set_title("needed / available", fontsize=8)
    ax.tick_params(axis="y", labelsize=8)
    ax.legend(fontsize=7, loc="upper center", ncols=2, frameon=False)
