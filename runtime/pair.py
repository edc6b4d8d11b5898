"""Model pairs: load any local Hugging Face causal-LM pair, or build the project's own pair offline.

    python -m runtime.pair build                 # the full pair: < 10 min on 2 cores, cached
    python -m runtime.pair build --preset tiny   # seconds: what the tests use
    python -m runtime.pair info PATH

No weights can be downloaded here, so SpecSched trains its own pair on text every Python install
carries: the CPython standard library's source (``test/`` and ``site-packages/`` excluded; every
50th file held out). The target is a small Llama (byte vocabulary) trained with cross-entropy; the
draft is a much smaller Llama distilled from it (forward KL to the target's distribution). A pair
is a folder ``target/`` + ``draft/`` (``save_pretrained`` + tokenizer) + ``pair.json`` (sizes,
bits per byte, acceptance by prompt type, training time), cached by the hash of its recipe.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sysconfig
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from runtime.tokenizer import ByteTokenizer, check_same_tokenizer, load_tokenizer

CACHE = Path(os.environ.get("SPECSCHED_CACHE", Path.home() / ".cache" / "specsched"))

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

    def config(self, vocab: int, max_positions: int):
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=vocab, hidden_size=self.hidden, intermediate_size=self.intermediate, num_hidden_layers=self.layers,
            num_attention_heads=self.heads, num_key_value_heads=self.kv_heads, max_position_embeddings=max_positions,
            tie_word_embeddings=True, bos_token_id=ByteTokenizer.BOS, eos_token_id=ByteTokenizer.EOS, pad_token_id=ByteTokenizer.PAD,
        )


@dataclass
class PairRecipe:
    # The target is sized so that one decode step costs ~12x a draft step on a CPU: with tiny
    # models the per-pass framework overhead is fixed, and SD pays off only if the target's own
    # compute dominates it. The draft is as small as still predicts code well.
    target: ModelShape = field(default_factory=lambda: ModelShape(384, 6, 8, 4, 1024))
    draft: ModelShape = field(default_factory=lambda: ModelShape(96, 1, 4, 2, 256))
    seq_len: int = 256
    batch: int = 8
    target_seconds: float = 360.0
    draft_seconds: float = 150.0
    target_lr: float = 2e-3
    draft_lr: float = 3e-3
    max_files: int | None = None  #: limit the corpus (tiny preset)
    seed: int = 0

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


PRESETS = {
    "full": PairRecipe(),
    # the tests' pair: seconds to build, still a trained target and a distilled draft
    "tiny": PairRecipe(target=ModelShape(64, 2, 4, 2, 128), draft=ModelShape(32, 1, 2, 1, 64), seq_len=128, batch=8, target_seconds=8.0, draft_seconds=4.0, max_files=40),
}


def corpus(max_files: int | None = None) -> tuple[bytes, bytes]:
    """(train, held-out) bytes of the standard library's Python source."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if not ({"test", "tests", "site-packages", "idle_test"} & set(p.relative_to(root).parts)))
    if max_files:
        files = files[:: max(1, len(files) // max_files)][:max_files]
    train, held = [], []
    for i, f in enumerate(files):
        try:
            data = f.read_bytes()
        except OSError:
            continue
        (held if i % 50 == 49 else train).append(data)
    if not train:
        raise RuntimeError(f"no Python source found under {root}")
    return b"\n\n".join(train), b"\n\n".join(held or train[-1:])


def _batches(data: np.ndarray, seq_len: int, batch: int, rng: np.random.Generator):
    while True:
        starts = rng.integers(0, len(data) - seq_len - 1, size=batch)
        chunk = np.stack([data[s : s + seq_len + 1] for s in starts]).astype(np.int64)
        yield torch.from_numpy(chunk)


def _train(model, step_loss, seconds: float, lr: float, desc: str, progress: bool) -> int:
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    start, steps = time.perf_counter(), 0
    bar = tqdm(total=int(seconds), desc=desc, unit="s", disable=not progress)
    last = 0
    model.train()
    while (elapsed := time.perf_counter() - start) < seconds:
        warm = min(1.0, (steps + 1) / 50)
        decay = 0.1 + 0.9 * max(0.0, 1 - elapsed / seconds)  # linear decay to 10 %
        for grp in opt.param_groups:
            grp["lr"] = lr * warm * decay
        loss = step_loss()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        steps += 1
        if int(elapsed) > last:
            bar.update(int(elapsed) - last)
            last = int(elapsed)
            bar.set_postfix(loss=f"{loss.item():.3f}", steps=steps)
    bar.close()
    model.eval()
    return steps


@torch.no_grad()
def bits_per_byte(model, data: np.ndarray, seq_len: int, windows: int = 32) -> float:
    rng = np.random.default_rng(123)
    batch = next(_batches(data, seq_len, windows, rng))
    logits = model(batch[:, :-1]).logits
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    return float(nll / np.log(2))


@torch.no_grad()
def greedy_acceptance(target, draft, tokenizer, prompts: list[str], new_tokens: int = 64) -> float:
    """Argmax agreement of the draft along the target's greedy continuation (alpha for greedy SD)."""
    from runtime.engines import generate_ad

    agree = total = 0
    for text in prompts:
        ids = tokenizer.encode(text)
        cont = generate_ad(target, [ids], new_tokens).tokens[0]
        seq = torch.tensor([ids + cont])
        t_arg = target(seq).logits.argmax(-1)[0, len(ids) - 1 : -1]
        d_arg = draft(seq).logits.argmax(-1)[0, len(ids) - 1 : -1]
        agree += int((t_arg == d_arg).sum())
        total += len(cont)
    return agree / max(total, 1)


def build_pair(out: str | Path | None = None, recipe: PairRecipe | str = "full", progress: bool = True, force: bool = False) -> Path:
    """Train (or reuse from the cache) a target/draft pair; returns its folder."""
    from transformers import LlamaForCausalLM

    recipe = PRESETS[recipe] if isinstance(recipe, str) else recipe
    out = Path(out) if out else CACHE / f"pair-{recipe.digest()}"
    meta_path = out / "pair.json"
    if meta_path.is_file() and not force and json.loads(meta_path.read_text()).get("recipe_digest") == recipe.digest():
        return out
    torch.manual_seed(recipe.seed)
    rng = np.random.default_rng(recipe.seed)
    tok = ByteTokenizer()
    train_bytes, held_bytes = corpus(recipe.max_files)
    train = np.frombuffer(train_bytes, dtype=np.uint8)
    held = np.frombuffer(held_bytes, dtype=np.uint8)
    max_pos = 4096
    target = LlamaForCausalLM(recipe.target.config(tok.vocab_size, max_pos))
    draft = LlamaForCausalLM(recipe.draft.config(tok.vocab_size, max_pos))
    batches = _batches(train, recipe.seq_len, recipe.batch, rng)
    ce = torch.nn.functional.cross_entropy

    def target_loss():
        b = next(batches)
        logits = target(b[:, :-1]).logits
        return ce(logits.reshape(-1, logits.shape[-1]), b[:, 1:].reshape(-1))

    t_steps = _train(target, target_loss, recipe.target_seconds, recipe.target_lr, "target", progress)

    def draft_loss():
        b = next(batches)[:, :-1]
        with torch.no_grad():
            t_logp = torch.log_softmax(target(b).logits, -1)
        d_logp = torch.log_softmax(draft(b).logits, -1)
        return torch.nn.functional.kl_div(d_logp, t_logp, log_target=True, reduction="batchmean") / b.shape[1]

    d_steps = _train(draft, draft_loss, recipe.draft_seconds, recipe.draft_lr, "draft (distil)", progress)
    tmp = out.with_name(out.name + ".tmp")
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(tmp / name)
        tok.save(tmp / name)
    meta = {
        "recipe": asdict(recipe),
        "recipe_digest": recipe.digest(),
        "target_params": sum(p.numel() for p in target.parameters()),
        "draft_params": sum(p.numel() for p in draft.parameters()),
        "target_steps": t_steps,
        "draft_steps": d_steps,
        "train_bytes": len(train),
        "held_out_bytes": len(held),
        "bits_per_byte": {"target": bits_per_byte(target, held, recipe.seq_len), "draft": bits_per_byte(draft, held, recipe.seq_len)},
        "greedy_acceptance": {"code": greedy_acceptance(target, draft, tok, CODE_PROMPTS), "prose": greedy_acceptance(target, draft, tok, PROSE_PROMPTS)},
        "build_seconds": recipe.target_seconds + recipe.draft_seconds,
    }
    (tmp / "pair.json").write_text(json.dumps(meta, indent=2))
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)  # nothing half-written is left at the final path
    return out


@dataclass
class ModelPair:
    target: torch.nn.Module
    draft: torch.nn.Module
    tokenizer: object
    path: Path | None = None

    @property
    def device(self):
        return next(self.target.parameters()).device


def load_pair(target_path: str | Path, draft_path: str | Path | None = None, device: str = "cpu", dtype: str = "float32") -> ModelPair:
    """Load a pair from local folders (``target_path`` may be a built pair's folder)."""
    from transformers import AutoModelForCausalLM

    target_path = Path(target_path)
    if draft_path is None:
        if not (target_path / "target").is_dir():
            raise FileNotFoundError(f"{target_path} is not a pair folder (target/ + draft/); pass draft_path")
        target_path, draft_path = target_path / "target", target_path / "draft"
    draft_path = Path(draft_path)
    for p in (target_path, draft_path):
        if not p.is_dir():
            raise FileNotFoundError(f"no model folder at {p}")
    t_tok, d_tok = load_tokenizer(target_path), load_tokenizer(draft_path)
    check_same_tokenizer(t_tok, d_tok)
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"dtype must be a torch dtype name such as float32, float16, bfloat16; got {dtype!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    load = dict(local_files_only=True, dtype=torch_dtype)
    target = AutoModelForCausalLM.from_pretrained(str(target_path), **load).to(device).eval()
    draft = AutoModelForCausalLM.from_pretrained(str(draft_path), **load).to(device).eval()
    return ModelPair(target, draft, t_tok, target_path.parent)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="train the project's own pair (cached)")
    b.add_argument("--preset", choices=sorted(PRESETS), default="full")
    b.add_argument("--out", type=Path, default=None)
    b.add_argument("--force", action="store_true")
    i = sub.add_parser("info", help="print a built pair's pair.json")
    i.add_argument("path", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    if args.cmd == "build":
        path = build_pair(args.out, args.preset, force=args.force)
        print(path)
        print((path / "pair.json").read_text())
    else:
        print((args.path / "pair.json").read_text())


if __name__ == "__main__":
    main()
