"""Model pairs: load any local Hugging Face causal-LM pair, or build the project's own pair offline.

    python -m runtime.pair build                 # the full pair: ~9 min on 2 idle cores, cached
    python -m runtime.pair build --preset tiny   # seconds: what the tests use
    python -m runtime.pair build --meta-out results/pair.json
    python -m runtime.pair info PATH

No weights can be downloaded here, so SpecSched trains its own pair on text every Python install
carries: the CPython standard library's source (``test/`` and ``site-packages/`` excluded; every
50th file held out). The target is a small Llama (byte vocabulary) trained with cross-entropy; the
draft is a much smaller Llama distilled from it (forward KL to the target's distribution). A pair
is a folder ``target/`` + ``draft/`` (``save_pretrained`` + tokenizer) + ``pair.json`` (sizes,
bits per byte, acceptance by prompt type, steps and the time they took), cached under the hash of
its recipe. Training is bounded by steps, reproducible bit for bit on one machine and torch
version, and a build that misses the recipe's held-out bits/byte bound is refused, not cached.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sysconfig
import time
from contextlib import contextmanager
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


def corpus(max_files: int | None = None) -> tuple[bytes, bytes]:
    """(train, held-out) bytes of the standard library's Python source.

    Every 50th file is held out, and always the last one, so even a small corpus keeps a held-out
    file that training never sees.
    """
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
        (held if i % 50 == 49 or i == len(files) - 1 else train).append(data)
    if not train or not held:
        raise RuntimeError(f"no Python source found under {root}")
    return b"\n\n".join(train), b"\n\n".join(held)


def _batches(data: np.ndarray, seq_len: int, batch: int, rng: np.random.Generator):
    if len(data) < seq_len + 2:
        raise RuntimeError(f"corpus of {len(data)} bytes is shorter than one window of seq_len {seq_len}")
    while True:
        starts = rng.integers(0, len(data) - seq_len - 1, size=batch)
        chunk = np.stack([data[s : s + seq_len + 1] for s in starts]).astype(np.int64)
        yield torch.from_numpy(chunk)


def _train(model, step_loss, steps: int, lr: float, desc: str, progress: bool) -> float:
    """``steps`` AdamW steps (linear warm-up over 50, linear decay to 10 %); returns seconds taken."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    start = time.perf_counter()
    model.train()
    with tqdm(total=steps, desc=desc, unit="step", disable=not progress) as bar:
        for step in range(steps):
            warm = min(1.0, (step + 1) / 50)
            decay = 0.1 + 0.9 * (1 - step / steps)
            for grp in opt.param_groups:
                grp["lr"] = lr * warm * decay
            loss = step_loss()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            bar.update(1)
            if step % 10 == 0:
                bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
    return time.perf_counter() - start


@torch.no_grad()
def bits_per_byte(model, data: np.ndarray, seq_len: int, windows: int = 32) -> float:
    """Held-out cross-entropy in bits per byte on ``windows`` fixed random windows of ``data``."""
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


@contextmanager
def _deterministic(threads: int, seed: int):
    """Seeded RNGs, deterministic algorithms and a fixed thread count; the caller's state is restored."""
    old_threads, old_det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(True)
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(old_det)
            torch.set_num_threads(old_threads)


def _train_pair(recipe: PairRecipe, progress: bool):
    """Train the target, then distil the draft from it: ``(target, draft, meta)``."""
    from transformers import LlamaForCausalLM

    tok = ByteTokenizer()
    train_bytes, held_bytes = corpus(recipe.max_files)
    train = np.frombuffer(train_bytes, dtype=np.uint8)
    held = np.frombuffer(held_bytes, dtype=np.uint8)
    with _deterministic(recipe.threads, recipe.seed):
        rng = np.random.default_rng(recipe.seed)
        max_pos = 4096
        target = LlamaForCausalLM(recipe.target.config(tok.vocab_size, max_pos))
        draft = LlamaForCausalLM(recipe.draft.config(tok.vocab_size, max_pos))
        batches = _batches(train, recipe.seq_len, recipe.batch, rng)
        ce = torch.nn.functional.cross_entropy

        def target_loss():
            b = next(batches)
            logits = target(b[:, :-1]).logits
            return ce(logits.reshape(-1, logits.shape[-1]), b[:, 1:].reshape(-1))

        t_seconds = _train(target, target_loss, recipe.target_steps, recipe.target_lr, "target", progress)

        def draft_loss():
            b = next(batches)[:, :-1]
            with torch.no_grad():
                t_logp = torch.log_softmax(target(b).logits, -1)
            d_logp = torch.log_softmax(draft(b).logits, -1)
            return torch.nn.functional.kl_div(d_logp, t_logp, log_target=True, reduction="batchmean") / b.shape[1]

        d_seconds = _train(draft, draft_loss, recipe.draft_steps, recipe.draft_lr, "draft (distil)", progress)
        held_len = min(recipe.seq_len, len(held) - 2)
        bits = {"target": bits_per_byte(target, held, held_len), "draft": bits_per_byte(draft, held, held_len)}
        acceptance = {"code": greedy_acceptance(target, draft, tok, CODE_PROMPTS), "prose": greedy_acceptance(target, draft, tok, PROSE_PROMPTS)}
    meta = {
        "recipe": asdict(recipe),
        "recipe_digest": recipe.digest(),
        "target_params": sum(p.numel() for p in target.parameters()),
        "draft_params": sum(p.numel() for p in draft.parameters()),
        "target_steps": recipe.target_steps,
        "draft_steps": recipe.draft_steps,
        "train_bytes": len(train),
        "held_out_bytes": len(held),
        "bits_per_byte": bits,
        "greedy_acceptance": acceptance,
        # measured, for information: the weights do not depend on them
        "train_seconds": {"target": round(t_seconds, 1), "draft": round(d_seconds, 1)},
        "steps_per_s": {"target": round(recipe.target_steps / t_seconds, 3), "draft": round(recipe.draft_steps / d_seconds, 3)},
        "torch": str(torch.__version__),
    }
    return target, draft, meta


def _cached(out: Path, recipe: PairRecipe) -> bool:
    """A complete pair of this recipe is at ``out`` (its bits/byte are re-checked against the bounds)."""
    try:
        meta = json.loads((out / "pair.json").read_text())
    except (OSError, ValueError):
        return False
    if meta.get("recipe_digest") != recipe.digest() or not ((out / "target").is_dir() and (out / "draft").is_dir()):
        return False
    failures = recipe.quality_failures(meta.get("bits_per_byte") or {})
    if failures:
        raise PairQualityError(f"the cached pair at {out} misses its recipe's held-out bound ({'; '.join(failures)}); delete it or loosen the bound")
    return True


def _clear_stale_partials(out: Path) -> None:
    """Remove partial builds (and replaced pairs) of ``out`` left by killed processes (the pid in the name is gone)."""
    for stale in [*out.parent.glob(f".{out.name}.*.partial"), *out.parent.glob(f".{out.name}.*.old")]:
        try:
            os.kill(int(stale.name.split(".")[-2]), 0)
        except (ValueError, ProcessLookupError):
            shutil.rmtree(stale, ignore_errors=True)
        except PermissionError:  # alive, owned by someone else
            pass


def _publish(tmp: Path, out: Path) -> None:
    """Move a finished build to ``out`` with renames only: ``out`` is either the old or the new pair."""
    if out.exists():
        old = out.with_name(f".{out.name}.{os.getpid()}.old")
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(out)


def build_pair(out: str | Path | None = None, recipe: PairRecipe | str = "full", progress: bool = True, force: bool = False) -> Path:
    """Train (or reuse from the cache) a target/draft pair; returns its folder.

    The build happens in a hidden ``.NAME.PID.partial`` folder beside ``out`` and is renamed into
    place only when complete and within the recipe's bits/byte bounds: a killed or refused build
    leaves nothing at ``out`` (and its partial folder is swept by the next build).

    Raises:
        PairQualityError: the trained pair misses the recipe's held-out bits/byte bound.
    """
    recipe = recipe_for(recipe)
    out = Path(out) if out else CACHE / f"pair-{recipe.digest()}"
    if not force and _cached(out, recipe):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    _clear_stale_partials(out)
    start = time.perf_counter()
    target, draft, meta = _train_pair(recipe, progress)
    meta["build_seconds"] = round(time.perf_counter() - start, 1)
    failures = recipe.quality_failures(meta["bits_per_byte"])
    if failures:
        raise PairQualityError(f"the pair built from recipe {recipe.digest()} misses its held-out bound ({'; '.join(failures)}); nothing was cached")
    tmp = out.with_name(f".{out.name}.{os.getpid()}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tok = ByteTokenizer()
        for name, model in (("target", target), ("draft", draft)):
            model.save_pretrained(tmp / name)
            tok.save(tmp / name)
        (tmp / "pair.json").write_text(json.dumps(meta, indent=2))
        _publish(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # a no-op after a successful rename
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
    b.add_argument("--meta-out", type=Path, default=None, help="also write the pair's pair.json here (e.g. results/pair.json)")
    i = sub.add_parser("info", help="print a built pair's pair.json")
    i.add_argument("path", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "build":
        if args.meta_out is not None:
            args.meta_out.parent.mkdir(parents=True, exist_ok=True)  # fail now, not after the build
        try:
            path = build_pair(args.out, args.preset, force=args.force)
        except PairQualityError as exc:
            raise SystemExit(str(exc)) from None
        meta = json.loads((path / "pair.json").read_text())
        meta["recipe"] = asdict(recipe_for(args.preset))  # same weights (same digest); the bounds it was checked against now
        text = json.dumps(meta, indent=2)
        if args.meta_out is not None:
            tmp = args.meta_out.with_name(f".{args.meta_out.name}.{os.getpid()}.tmp")
            tmp.write_text(text)
            tmp.replace(args.meta_out)
        print(path)
        print(text)
    else:
        print((args.path / "pair.json").read_text())


if __name__ == "__main__":
    main()
