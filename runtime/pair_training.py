"""Training the project's own pair offline (``runtime.pair build``): the corpus (the CPython
standard library's source), the target's cross-entropy training, the draft's distillation, and
the held-out bits per byte and greedy acceptance recorded in ``pair.json``. Bounded by optimizer
steps and deterministic (:func:`train_pair`)."""

from __future__ import annotations

import sysconfig
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from tqdm import tqdm

from runtime.pair_recipe import CODE_PROMPTS, PROSE_PROMPTS, PairRecipe
from runtime.tokenizer import ByteTokenizer

if TYPE_CHECKING:
    from runtime.tokenizer import Tokenizer


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
def bits_per_byte(model: torch.nn.Module, data: np.ndarray, seq_len: int, windows: int = 32) -> float:
    """Held-out cross-entropy in bits per byte on ``windows`` fixed random windows of ``data``."""
    rng = np.random.default_rng(123)
    batch = next(_batches(data, seq_len, windows, rng))
    logits = model(batch[:, :-1]).logits
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    return float(nll / np.log(2))


@torch.no_grad()
def greedy_acceptance(target: torch.nn.Module, draft: torch.nn.Module, tokenizer: Tokenizer, prompts: list[str], new_tokens: int = 64) -> float:
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


def train_pair(recipe: PairRecipe, progress: bool) -> tuple[torch.nn.Module, torch.nn.Module, dict]:
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
