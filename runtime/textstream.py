"""Token ids -> text, incrementally, for streaming: whole characters only, stop sequences honoured.

A byte-level tokenizer emits a multi-byte UTF-8 character over several tokens; decoding each piece
alone would turn it into U+FFFD. :class:`TextStream` decodes everything generated so far and hands
out only the new, settled suffix: a trailing U+FFFD (an unfinished character) and a trailing prefix
of a stop sequence are held back until the next tokens settle them. Works for any tokenizer with
``decode(ids) -> str`` (Hugging Face ones included: merges that change earlier text are handled by
the same hold-back). Output is at most a few hundred tokens, so re-decoding is cheap.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"


class TextStream:
    """One request's output text; not thread-safe (one engine thread feeds it, under a lock)."""

    def __init__(self, decode: Callable[[list[int]], str], stops: Sequence[str] = ()):
        self.decode = decode
        self.stops = [s for s in stops if s]
        self.ids: list[int] = []
        self.text = ""  #: decoded so far (cut at a stop sequence once one is seen)
        self.sent = 0  #: characters of ``text`` already handed out
        self.stopped = False  #: a stop sequence was found: the text ends before it

    @property
    def tokens(self) -> int:
        """Generated tokens that count towards the output (none after a stop sequence)."""
        return len(self.ids)

    def feed(self, new: Sequence[int]) -> None:
        if self.stopped:
            return
        before = len(self.ids)
        self.ids.extend(new)
        text = self.decode(self.ids)
        if self.stops:
            # only the part that could hold a new match needs searching
            lo = max(0, min(len(self.text), len(text)) - max(len(s) for s in self.stops))
            at = self._stop_at(text, lo)
            if at >= 0:
                # a speculative chunk can run past the stop: keep the tokens up to the one that
                # completes the first stop sequence and cut the text where the stops found by then
                # begin -- what one token at a time would have given (text and usage alike)
                for m in range(before + 1, len(self.ids)):
                    head = self.decode(self.ids[:m])
                    head_at = self._stop_at(head, lo)
                    if head_at >= 0:
                        del self.ids[m:]
                        text, at = head, head_at
                        break
                text, self.stopped = text[:at], True
        self.text = text

    def _stop_at(self, text: str, lo: int) -> int:
        """Where the earliest stop sequence found in ``text[lo:]`` begins (-1: none)."""
        hits = [i for s in self.stops if (i := text.find(s, lo)) >= 0]
        return min(hits) if hits else -1

    def _settled(self) -> int:
        """How many characters of ``text`` cannot change any more."""
        end = len(self.text)
        while end > self.sent and self.text[end - 1] == REPLACEMENT:
            end -= 1
        for s in self.stops:
            for k in range(min(len(s) - 1, end - self.sent), 0, -1):
                if self.text[end - k : end] == s[:k]:
                    end -= k
                    break
        return end

    def take(self, final: bool = False) -> str:
        """New text since the last call; ``final`` hands out everything left."""
        end = len(self.text) if final or self.stopped else self._settled()
        end = max(end, self.sent)
        piece, self.sent = self.text[self.sent : end], end
        return piece
