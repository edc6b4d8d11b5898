"""What decides a model pair's weights (:class:`PairRecipe`, whose digest is the pair's cache key),
the named presets, and the prompts a pair's acceptance is measured on."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from runtime.tokenizer import ByteTokenizer

if TYPE_CHECKING:
    from transformers import LlamaConfig

#: prompts for measuring acceptance by type: the pair is trained on code, so prose is off-domain
CODE_PROMPTS = [
    "def __init__(self, ",
    "    for i in range(len(",
    "import os\nimport sys\n\n\ndef main():\n    ",
    "class Stack:\n    def push(self, item):\n        ",
    "        if not isinstance(value, str):\n            raise TypeError(",
    "    return sorted(items, key=lambda x: ",
]
PROSE_PROMPTS = [
    "The three main causes of the French Revolution were",
    "Speculative decoding is a technique that",
    "Once upon a time, in a small village by the sea,",
    "Edge servers host language models close to users so that",
]


@dataclass
class ModelShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int

    def config(self, vocab: int, max_positions: int) -> LlamaConfig:
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=vocab, hidden_size=self.hidden, intermediate_size=self.intermediate, num_hidden_layers=self.layers,
            num_attention_heads=self.heads, num_key_value_heads=self.kv_heads, max_position_embeddings=max_positions,
            tie_word_embeddings=True, bos_token_id=ByteTokenizer.BOS, eos_token_id=ByteTokenizer.EOS, pad_token_id=ByteTokenizer.PAD,
        )


class PairQualityError(RuntimeError):
    """A freshly built pair misses its recipe's held-out bits/byte bound: it is refused, not cached."""


#: recipe fields that do not change the weights, so they stay out of the cache key
_NOT_IN_DIGEST = ("max_target_bits_per_byte", "max_draft_bits_per_byte")


@dataclass
class PairRecipe:
    """Everything that decides a pair's weights; its digest is the cache key.

    Training is bounded by optimizer *steps*, never by wall-clock time, so a loaded machine makes
    the same pair, only later. With the same recipe, machine and torch version two builds give
    bitwise-identical weights: seeded init and data order, deterministic algorithms and a fixed
    ``threads`` count (the split of a matmul over threads changes its rounding).
    """

    # The target is sized so that one decode step costs ~12x a draft step on a CPU: with tiny
    # models the per-pass framework overhead is fixed, and SD pays off only if the target's own
    # compute dominates it. The draft is as small as still predicts code well.
    target: ModelShape = field(default_factory=lambda: ModelShape(384, 6, 8, 4, 1024))
    draft: ModelShape = field(default_factory=lambda: ModelShape(96, 1, 4, 2, 256))
    seq_len: int = 256
    batch: int = 8
    target_steps: int = 400
    draft_steps: int = 500
    target_lr: float = 2e-3
    draft_lr: float = 3e-3
    max_files: int | None = None  #: limit the corpus (tiny preset)
    seed: int = 0
    # One thread: the split of a matmul over threads can change its rounding, and on a shared
    # machine two spinning threads ran 3x slower than one (4.4 vs 14 s per target step, load ~5).
    threads: int = 1  #: torch CPU threads while building (part of the weights' identity)
    #: a build whose held-out bits/byte exceed these is refused (None: no check)
    max_target_bits_per_byte: float | None = None
    max_draft_bits_per_byte: float | None = None

    def __post_init__(self) -> None:
        for name in ("seq_len", "batch", "target_steps", "draft_steps", "threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"pair recipe field '{name}' must be an integer >= 1, got {value!r}")
        for name in ("target_lr", "draft_lr"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"pair recipe field '{name}' must be in (0, 1), got {getattr(self, name)!r}")
        for name in _NOT_IN_DIGEST:
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int | float) and 0 < value < 9):
                raise ValueError(f"pair recipe field '{name}' must be None or bits/byte in (0, 9), got {value!r}")
        if self.max_files is not None and self.max_files < 2:
            raise ValueError(f"pair recipe field 'max_files' must be None or >= 2 (one file is held out), got {self.max_files!r}")

    def digest(self) -> str:
        weights = {k: v for k, v in asdict(self).items() if k not in _NOT_IN_DIGEST}
        return hashlib.sha256(json.dumps(weights, sort_keys=True).encode()).hexdigest()[:12]

    def quality_failures(self, bits: dict[str, float]) -> list[str]:
        """Which held-out bits/byte (``{"target": .., "draft": ..}``) miss this recipe's bounds."""
        out = []
        for model, bound in (("target", self.max_target_bits_per_byte), ("draft", self.max_draft_bits_per_byte)):
            value = float(bits.get(model, float("nan")))  # unmeasured counts as a miss
            if bound is not None and not value <= bound:  # NaN fails too
                out.append(f"{model} {value:.3f} bits/byte > bound {bound}")
        return out


PRESETS = {
    # bounds: what the build on the project's 2-core CPU reached (target 2.385, draft 2.591 bits/byte;
    # results/pair.json) plus ~0.2 bits; a wall-clock-starved build (~30 target steps) is > 3.5
    "full": PairRecipe(max_target_bits_per_byte=2.6, max_draft_bits_per_byte=2.8),
    # the tests' pair: seconds to build, still a trained target and a distilled draft
    "tiny": PairRecipe(target=ModelShape(64, 2, 4, 2, 128), draft=ModelShape(32, 1, 2, 1, 64), seq_len=128, batch=8, target_steps=200, draft_steps=150,
                       max_files=40, max_target_bits_per_byte=4.8, max_draft_bits_per_byte=5.6),
}


def recipe_for(recipe: PairRecipe | str) -> PairRecipe:
    """A recipe, or the preset of that name."""
    if isinstance(recipe, PairRecipe):
        return recipe
    if recipe not in PRESETS:
        raise ValueError(f"pair recipe preset must be one of {sorted(PRESETS)}, got {recipe!r}")
    return PRESETS[recipe]
