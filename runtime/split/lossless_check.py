"""Check greedy AD, SD and the split runtime against one another on a real pair and device
(``scripts/gpu_check.sh`` runs it on CUDA in float16).

    python -m runtime.split.lossless_check --pair PATH --device cuda --dtype float16 --out check.json

The reference is greedy AD, one prompt at a time. SD runs batched; the split runs ``--clients``
edge clients in threads against one batched verifier (in-process link, proactive drafting on),
each drafting with the model's own forward, then (a Llama draft) all on one batched draft device.
In float32 and float64 they agree token for token; in float16 a batched or padded forward may
round differently, so a divergence is accepted only where the reference's top-two logits at the
first differing position are within ``--tie-tolerance`` (a near tie that rounding can flip);
any other divergence is a failure (exit status 1).
"""

from __future__ import annotations

import argparse
import json
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from agents.artefacts import write_text_atomic
from runtime.engines import generate_ad, generate_sd
from runtime.pair import CODE_PROMPTS, PROSE_PROMPTS
from runtime.split.batched_drafter import BatchedDrafter, supports
from runtime.split.batcher import VerificationBatcher
from runtime.split.edge_client import EdgeClient
from runtime.split.pair_args import add_pair_args, load_pair_from_args
from runtime.split.transport import LocalLink
from runtime.split.verifier import BatchVerifier

if TYPE_CHECKING:
    from runtime.pair import ModelPair


def split_outputs(pair: ModelPair, prompts: list[list[int]], max_new: int, clients: int, depth: int, batched_drafts: bool = False) -> list[list[int]]:
    """The split's outputs; ``batched_drafts``: the clients share one batched draft device
    (:class:`~runtime.split.batched_drafter.BatchedDrafter`), else each drafts with the model's own forward."""
    batcher = VerificationBatcher(BatchVerifier(pair.target), cohorts=2, window_s=0.002)
    outputs: list[list[int] | None] = [None] * len(prompts)
    device = BatchedDrafter(pair.draft) if batched_drafts else None

    def client(c: int) -> None:
        edge = EdgeClient(pair.draft, LocalLink(batcher), depth=depth, proactive=True, draft_device=device)
        for i in range(c, len(prompts), clients):
            out = edge.generate(prompts[i], max_new)
            outputs[i] = out.tokens if out.outcome == "length" else None
        edge.link.close()

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    batcher.stop()
    if device is not None:
        device.close()
    return [o or [] for o in outputs]


@torch.no_grad()
def top2_margin(target: torch.nn.Module, context: list[int]) -> float:
    device = next(target.parameters()).device
    logits = target(input_ids=torch.tensor([context], device=device)).logits[0, -1].float()
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def compare(target: torch.nn.Module, prompts: list[list[int]], reference: list[list[int]], outputs: list[list[int]], tolerance: float) -> dict:
    identical, ties, failures = 0, [], []
    for i, (p, ref, out) in enumerate(zip(prompts, reference, outputs, strict=True)):
        if out == ref:
            identical += 1
            continue
        k = next((j for j, (a, b) in enumerate(zip(ref, out, strict=False)) if a != b), min(len(ref), len(out)))
        margin = top2_margin(target, p + ref[:k]) if k < min(len(ref), len(out)) else float("inf")
        (ties if margin <= tolerance else failures).append({"prompt": i, "position": k, "margin": margin})
    return {"identical": identical, "near_ties": ties, "failures": failures}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(ap)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--tie-tolerance", type=float, default=0.05, help="top-1 minus top-2 logit below which a divergence is a rounding tie")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.max_new_tokens < 1 or args.clients < 1 or args.depth < 1 or args.tie_tolerance < 0:
        raise SystemExit("--max-new-tokens, --clients and --depth must be >= 1 and --tie-tolerance >= 0")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pair = load_pair_from_args(args)
    tok = pair.tokenizer
    prompts = [tok.encode(p) for p in CODE_PROMPTS + PROSE_PROMPTS]
    reference = [generate_ad(pair.target, [p], args.max_new_tokens, pad_id=tok.pad_id).tokens[0] for p in prompts]
    results = {"device": args.device, "dtype": args.dtype, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "checks": {}}
    runs = {"ad_batched": generate_ad(pair.target, prompts, args.max_new_tokens, pad_id=tok.pad_id).tokens,
            "sd_batched": generate_sd(pair.target, pair.draft, prompts, args.depth, args.max_new_tokens, pad_id=tok.pad_id).tokens,
            "split": split_outputs(pair, prompts, args.max_new_tokens, args.clients, args.depth)}
    if supports(pair.draft):
        runs["split_batched_drafts"] = split_outputs(pair, prompts, args.max_new_tokens, args.clients, args.depth, batched_drafts=True)
    ok = True
    for name, outputs in runs.items():
        res = compare(pair.target, prompts, reference, outputs, args.tie_tolerance)
        results["checks"][name] = res
        ok &= not res["failures"]
        print(f"{name}: {res['identical']}/{len(prompts)} identical to AD, {len(res['near_ties'])} near-tie divergences, {len(res['failures'])} failures", flush=True)
    results["passed"] = ok
    write_text_atomic(args.out, json.dumps(results, indent=2))
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
