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
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from runtime.pair_recipe import (
    CODE_PROMPTS,
    PRESETS,
    PROSE_PROMPTS,
    ModelShape,
    PairQualityError,
    PairRecipe,
    recipe_for,
)
from runtime.pair_training import corpus, train_pair
from runtime.tokenizer import ByteTokenizer, check_same_tokenizer, load_tokenizer

CACHE = Path(os.environ.get("SPECSCHED_CACHE", Path.home() / ".cache" / "specsched"))

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
    target, draft, meta = train_pair(recipe, progress)
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
    def device(self) -> torch.device:
        """Where the target's weights are."""
        return next(self.target.parameters()).device


DTYPES = ("float32", "float16", "bfloat16")


def device_dtype_problem(device: str, dtype: str) -> str | None:
    """Why ``device`` / ``dtype`` cannot hold a pair (None when they can): checked before a pair is
    built or loaded, so a typo fails in a second rather than after the models load."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        return f"--device must be a torch device such as cpu, cuda or cuda:1, got {device!r}"
    if dev.type == "cuda" and not torch.cuda.is_available():
        return f"--device {device!r} requested but CUDA is not available"
    if dev.type not in ("cpu", "cuda", "mps"):
        return f"--device must be cpu, cuda[:N] or mps, got {device!r}"
    if dtype not in DTYPES:
        return f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}"
    return None


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


#: re-exported: the pair API in one place for callers
__all__ = ["CACHE", "CODE_PROMPTS", "PRESETS", "PROSE_PROMPTS", "ModelPair", "ModelShape", "PairQualityError", "PairRecipe", "build_pair", "corpus",
           "load_pair", "recipe_for", "train_pair"]


if __name__ == "__main__":
    main()
