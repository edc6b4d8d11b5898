"""Edge side: one user's drafting session -- the draft model's KV, its proposals, proactive
speculation while a verification is in flight, rollback on rejection.

The session keeps the committed text (``tokens``: prompt plus every emitted token) and a
``chain`` of draft tokens beyond it, drafted greedily (argmax) one after another. A proposal of
depth ``d`` is ``chain[:d]`` (drafted on demand). While those ``d`` tokens are being verified the
edge may keep extending the chain (proactive drafting, PEARL's post-verify): ``chain[d]`` is the
draft's guess for the server's bonus token "if everything is accepted", the tokens after it the
next block. When the verdict ``(n accepted, bonus)`` comes back the session keeps the longest
consistent prefix: if ``chain[n] == bonus`` the rest of the chain was drafted on exactly the
context that is now committed and becomes the next block's head start (a *proactive hit*);
otherwise the chain is dropped and the draft KV is cropped back to the common prefix.

Greedy drafting is what maximises sample-and-match acceptance (``p(argmax q)`` rather than
``sum p q``); it never affects losslessness, which the server's rule guarantees on its own.

Drafting runs until the chain is long enough or a ``stop`` callable says so (:meth:`DraftChain.extend`),
so proactive drafting stops as soon as the verdict arrives.
:class:`DraftSession` drafts with the model's own forward on a device of its own;
:class:`runtime.split.batched_drafter.BatchedDraftSession` joins one batched step with the other
sessions of a shared device.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from transformers import DynamicCache


class DraftChain:
    """The committed text and the draft chain of one user request (batch 1); how the chain is
    extended is the subclass's (:meth:`extend`), as is dropping draft KV (:meth:`_crop_kv`)."""

    def __init__(self, prompt: list[int]):
        if not prompt:
            raise ValueError("prompt needs at least one token")
        self.tokens: list[int] = list(prompt)  #: committed text
        self.chain: list[int] = []  #: draft tokens beyond the committed text, in order
        self.fed = 0  #: tokens of ``tokens + chain`` whose KV the draft cache holds
        self.draft_seconds = 0.0  #: time spent drafting (with a shared batched device: the wall time of its steps, waits included)
        self.wait_seconds = 0.0  #: of that, time waiting for a shared device to take the request (0 with a device of its own)
        #: of that, time speculative drafting sat out for other sessions' on-demand drafting (a yielding shared device; else 0)
        self.held_seconds = 0.0
        self.draft_steps = 0

    def extend(self, upto: int, stop: Callable[[], bool] | None = None, speculative: bool = False) -> None:
        """Draft until the chain holds ``upto`` tokens, or ``stop()`` (asked before each step) is true.
        ``speculative`` marks proactive drafting, which a shared device may hold back for on-demand
        drafting (:class:`~runtime.split.batched_drafter.BatchedDrafter`); a device of one's own ignores it."""
        raise NotImplementedError

    def _crop_kv(self, valid: int) -> None:
        """Drop the draft KV of every position from ``valid`` on."""

    def unseen(self) -> list[int]:
        """The tokens of ``tokens + chain`` the draft has not fed yet (never empty: the last one's
        logits give the next draft token)."""
        return (self.tokens + self.chain)[self.fed :]

    def record_draft(self, token: int) -> None:
        """One draft step happened: every unseen token is fed now, and ``token`` joins the chain."""
        self.fed = len(self.tokens) + len(self.chain)
        self.chain.append(token)
        self.draft_steps += 1

    def draft_one(self) -> int:
        """Extend the chain by one draft token (feeds every token the draft has not seen yet)."""
        self.extend(len(self.chain) + 1)
        return self.chain[-1]

    def propose(self, depth: int) -> list[int]:
        """The next ``depth`` draft tokens (drafting only what the chain lacks)."""
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.extend(depth)
        return self.chain[:depth]

    def commit(self, depth: int, accepted: int, bonus: int) -> bool:
        """Apply the verdict on ``chain[:depth]``: the text grows by ``chain[:accepted] + [bonus]``.
        Returns whether speculation beyond the block was reused (a proactive hit)."""
        if not 0 <= accepted <= depth <= len(self.chain):
            raise ValueError(f"verdict accepted={accepted} does not fit the proposed depth {depth} (chain {len(self.chain)})")
        keep = len(self.chain) > accepted and self.chain[accepted] == bonus
        hit = keep and accepted == depth  # the guessed bonus was right: the speculation stands
        self.tokens.extend(self.chain[:accepted] + [bonus])
        if keep:
            self.chain = self.chain[accepted + 1 :]
        else:
            self.chain = []
            valid = len(self.tokens) - 1  # the bonus is new to the draft
            if self.fed > valid:
                self._crop_kv(valid)
                self.fed = valid
        return hit

    def close(self) -> None:
        """Free what the session holds on a shared device (nothing here)."""


class DraftSession(DraftChain):
    """A draft chain on a draft model of its own (the model's own forward and KV cache)."""

    def __init__(self, draft, prompt: list[int]):
        super().__init__(prompt)
        self.model = draft
        self.device = next(draft.parameters()).device
        self.cache = DynamicCache()

    @torch.no_grad()
    def extend(self, upto: int, stop: Callable[[], bool] | None = None, speculative: bool = False) -> None:
        while len(self.chain) < upto and not (stop is not None and stop()):
            t0 = time.perf_counter()
            unseen = self.unseen()
            new = torch.tensor([unseen], dtype=torch.long, device=self.device)  # (1, unseen)
            positions = torch.arange(self.fed, self.fed + len(unseen), device=self.device)[None, :]  # (1, unseen)
            logits = self.model(input_ids=new, position_ids=positions, past_key_values=self.cache, use_cache=True).logits
            self.record_draft(int(logits[0, -1].argmax()))
            self.draft_seconds += time.perf_counter() - t0

    def _crop_kv(self, valid: int) -> None:
        self.cache.crop(valid - self.fed)  # transformers 5: a negative count drops that many
