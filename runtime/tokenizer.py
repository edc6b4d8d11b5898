"""Tokenizers for model pairs: the project's byte tokenizer, or a Hugging Face tokenizer.

Both models of a pair must share one tokenizer (same ids for the same text): SD verifies the
draft's token ids directly. :func:`check_same_tokenizer` refuses a pair whose vocabularies differ.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

BYTE_TOKENIZER_FILE = "byte_tokenizer.json"


class Tokenizer(Protocol):
    vocab_size: int
    eos_id: int | None
    pad_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """256 byte values plus BOS, EOS and PAD: no training, no files, no unknown tokens."""

    BOS, EOS, PAD = 256, 257, 258
    vocab_size = 259

    def __init__(self) -> None:
        self.eos_id = self.EOS
        self.pad_id = self.PAD

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def save(self, folder: str | Path) -> None:
        (Path(folder) / BYTE_TOKENIZER_FILE).write_text(json.dumps({"type": "bytes", "vocab_size": self.vocab_size}))

    def fingerprint(self) -> str:
        return "bytes-259"


class HFTokenizer:
    """A Hugging Face tokenizer loaded from a local folder (never from the Hub)."""

    def __init__(self, folder: str | Path):
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        self.vocab_size = len(self.tok)
        self.eos_id = self.tok.eos_token_id
        self.pad_id = self.tok.pad_token_id if self.tok.pad_token_id is not None else (self.eos_id or 0)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def fingerprint(self) -> str:
        vocab = self.tok.get_vocab()
        return json.dumps(sorted(vocab.items()))


def load_tokenizer(folder: str | Path) -> ByteTokenizer | HFTokenizer:
    folder = Path(folder)
    if (folder / BYTE_TOKENIZER_FILE).is_file():
        return ByteTokenizer()
    return HFTokenizer(folder)


def check_same_tokenizer(a: Tokenizer, b: Tokenizer, where: tuple[str, str] = ("target", "draft")) -> None:
    if a.fingerprint() != b.fingerprint():
        raise ValueError(f"the {where[0]} and {where[1]} tokenizers differ (vocab sizes {a.vocab_size} and {b.vocab_size}); speculative decoding needs one shared vocabulary")
