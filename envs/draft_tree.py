"""Draft chains and trees: what an edge drafts per iteration and how many tokens it yields.

Part of SpecEdge's closed form (``envs.split_cost``, which re-exports these names).

**Expected tokens per iteration.** Sample-and-match verification accepts the deepest drafted node
whose ancestors all match the target's samples, plus the target's bonus token. We use the
*positional acceptance* model (as Sequoia / SpecExec do): the ``r``-th best child of a node is the
target's sample with probability ``p_r = alpha (1 - alpha)^(r - 1)``, so a node's probability of
lying on the accepted path is the product of ``p_r`` along its path and
``E = 1 + sum over drafted nodes of that product``. The tree is the ``budget`` nodes of highest
path probability (SpecEdge's own top-``budget`` selection by cumulative score), within ``depth``
levels, ``branch`` children per node, children only under the ``beams`` best nodes of a level.
For a chain this is exactly ``E = (1 - alpha^(g+1)) / (1 - alpha)``.

**Edge drafting** (batch 1 on the edge device, the profile's ``edge.tau_draft``): one pass per
level of the kept tree (``D`` levels); pass 1 forwards the root, pass ``l + 1`` either SpecEdge's
beam (``pass_width="beams"``, default: ``w_{l+1} = min(beams, w_l * branch)`` candidates, what its
beam search forwards before the final trim to ``budget``) or only the kept tree's level ``l``
(``"kept"``: ``min(beams, n_l)``, a lower bound), at context ``c + nodes drafted so far``. A chain of depth ``g``
costs ``sum_{i<g} tau_E(1, 1, c + i)``. Edge prefill: ``tau_E(1, I, I)``.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

PASS_WIDTHS = ("beams", "kept")


@dataclass(frozen=True)
class DraftTree:
    """Draft shape: ``budget`` nodes, ``beams`` expanded per level, ``branch`` children each, ``depth`` levels."""

    budget: int
    beams: int = 1
    branch: int = 1
    depth: int | None = None  #: None = budget (no depth limit beyond the budget)
    #: what each edge pass forwards: "beams" (SpecEdge's beam search: level l + 1 forwards
    #: min(beams, width_l * branch) candidates) or "kept" (only the kept tree's nodes, capped at beams)
    pass_width: str = "beams"

    def __post_init__(self) -> None:
        if self.pass_width not in PASS_WIDTHS:
            raise ValueError(f"draft tree field 'pass_width' must be one of {list(PASS_WIDTHS)}, got {self.pass_width!r}")
        for name in ("budget", "beams", "branch"):
            v = getattr(self, name)
            if not isinstance(v, int | np.integer) or isinstance(v, bool) or v < 1:
                raise ValueError(f"draft tree field '{name}' must be an integer >= 1, got {v!r}")
        if self.depth is not None and (not isinstance(self.depth, int | np.integer) or self.depth < 1):
            raise ValueError(f"draft tree field 'depth' must be null or an integer >= 1, got {self.depth!r}")

    @classmethod
    def chain(cls, depth: int) -> DraftTree:
        return cls(budget=int(depth), beams=1, branch=1, depth=int(depth))

    @property
    def max_depth(self) -> int:
        return self.budget if self.depth is None else min(self.depth, self.budget)

    @property
    def is_chain(self) -> bool:
        return self.beams == 1 and self.branch == 1

    @property
    def verify_tokens(self) -> int:
        """Query tokens per client in the verify pass: the drafts plus the root (previous bonus)."""
        return self.budget + 1


@dataclass(frozen=True)
class TreeShape:
    """A draft tree's expectation under acceptance ``alpha`` (see the module docstring)."""

    expected_tokens: float  #: accepted drafts + the bonus, per iteration
    pass_widths: tuple[int, ...]  #: tokens forwarded by each edge pass, in order
    level_nodes: tuple[int, ...]  #: drafted nodes per level 1..D
    level_accept: tuple[float, ...]  #: P(level d accepted | levels < d accepted)
    top_path_prob: float  #: P(the accepted path is the top-1 path to depth D): proactive reuse's first factor
    verify_tokens: int


def _expected_chain(alpha: float, g: int) -> float:
    return g + 1.0 if alpha > 1.0 - 1e-9 else (1.0 - alpha ** (g + 1.0)) / (1.0 - alpha)


@lru_cache(maxsize=1 << 16)
def _shape(alpha: float, tree: DraftTree) -> TreeShape:
    a = min(max(float(alpha), 0.0), 1.0)
    if tree.is_chain:
        g = tree.max_depth
        acc = tuple([a] * g)
        return TreeShape(_expected_chain(a, g), (1,) * g, (1,) * g, acc, a**g, tree.verify_tokens)
    p = [a * (1.0 - a) ** r for r in range(tree.branch)]  # positional acceptance of the r-th child
    heap = [(-p[0], 0, 1, 0, 1.0)]  # (-path prob, tie, level, rank index, parent's path prob)
    tie, chosen, per_level, mass = 1, 0, {}, {}
    while heap and chosen < tree.budget:
        neg, _, level, r, parent = heapq.heappop(heap)
        prob = -neg
        chosen += 1
        order = per_level.get(level, 0) + 1
        per_level[level] = order
        mass[level] = mass.get(level, 0.0) + prob
        if order <= tree.beams and level < tree.max_depth:  # expanded: its best child is a candidate
            heapq.heappush(heap, (-prob * p[0], tie, level + 1, 0, prob))
            tie += 1
        if r + 1 < tree.branch:  # the next sibling is a candidate
            heapq.heappush(heap, (-parent * p[r + 1], tie, level, r + 1, parent))
            tie += 1
    depth = max(per_level) if per_level else 0
    nodes = tuple(per_level[d] for d in range(1, depth + 1))
    if tree.pass_width == "kept":
        widths = (1,) + tuple(min(tree.beams, n) for n in nodes[:-1])
    else:
        w = [1]
        for _ in range(depth - 1):
            w.append(min(tree.beams, w[-1] * tree.branch))
        widths = tuple(w)
    s = [1.0] + [mass[d] for d in range(1, depth + 1)]
    acc = tuple(s[d] / s[d - 1] if s[d - 1] > 0 else 0.0 for d in range(1, depth + 1))
    return TreeShape(1.0 + sum(s[1:]), widths, nodes, acc, a**depth, tree.verify_tokens)


def tree_shape(alpha: float, tree: DraftTree) -> TreeShape:
    """The :class:`TreeShape` of ``tree`` at acceptance ``alpha`` (cached per ``(alpha, tree)``)."""
    return _shape(float(alpha), tree)


def expected_tokens(alpha: ArrayLike, tree: DraftTree) -> np.ndarray:
    """Expected tokens per iteration (accepted drafts + bonus); numpy over ``alpha``."""
    if tree.is_chain:
        a = np.asarray(alpha, dtype=float)
        g = float(tree.max_depth)
        near = a > 1.0 - 1e-9
        safe = np.where(near, 0.5, a)
        return np.where(near, g + 1.0, (1.0 - safe ** (g + 1.0)) / (1.0 - safe))
    return np.vectorize(lambda x: tree_shape(x, tree).expected_tokens, otypes=[float])(alpha)
