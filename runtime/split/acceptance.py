"""The acceptance rule of chain verification, as one pure function both sides use.

The server draws one target token per query position: ``samples[j]`` is the target's token after
the committed text plus ``drafts[:j]`` (argmax when greedy, a sample at temperature > 0). Draft
``j`` is accepted iff it equals ``samples[j]`` and every earlier draft was accepted; the server's
token right after the accepted prefix is the bonus (a correction after a rejection, or the extra
token when all drafts were accepted). Every emitted token is therefore the target's own choice
given the prefix before it: greedy output equals greedy AD, sampled output is distributed as the
target's (sample-and-match, SpecEdge's rule; it needs no draft probabilities on the wire).
"""

from __future__ import annotations


def accepted_length(drafts: list[int], samples: list[int]) -> int:
    """How many leading drafts match the server's tokens (``len(samples) == len(drafts) + 1``)."""
    if len(samples) != len(drafts) + 1:
        raise ValueError(f"samples must be one longer than drafts: {len(samples)} vs {len(drafts)}")
    n = 0
    while n < len(drafts) and drafts[n] == samples[n]:
        n += 1
    return n


def emitted(drafts: list[int], samples: list[int]) -> tuple[int, int]:
    """``(accepted drafts, bonus token)``: the text grows by ``drafts[:n] + [bonus]``."""
    n = accepted_length(drafts, samples)
    return n, samples[n]
