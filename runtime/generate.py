"""Try AD and SD on a prompt: tokens stream as they are produced, then speed and acceptance.

    python -m runtime.generate --prompt "def fibonacci(n):" --mode both --gamma 4
    python -m runtime.generate --target T --draft D --device cuda --dtype float16 --prompt "..."

Without ``--pair``/``--target`` the project's own pair is used (built and cached on first use).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from runtime.engines import generate_ad, generate_sd
from runtime.pair import PairQualityError, build_pair, load_pair


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--pair", type=Path, default=None)
    ap.add_argument("--target", type=Path, default=None)
    ap.add_argument("--draft", type=Path, default=None)
    ap.add_argument("--preset", default="full", help="which own pair to build if none is given")
    ap.add_argument("--mode", choices=["ad", "sd", "both"], default="both")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (with --temperature > 0)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.gamma < 1 or args.max_new_tokens < 1 or args.temperature < 0 or not 0 < args.top_p <= 1:
        raise SystemExit("--gamma and --max-new-tokens must be >= 1, --temperature >= 0 and --top-p in (0, 1]")
    if args.target:
        pair = load_pair(args.target, args.draft, device=args.device, dtype=args.dtype)
    else:
        try:
            pair = load_pair(args.pair or build_pair(recipe=args.preset), device=args.device, dtype=args.dtype)
        except PairQualityError as exc:
            raise SystemExit(str(exc)) from None
    tok = pair.tokenizer
    ids = tok.encode(args.prompt)
    if not ids:
        raise SystemExit("--prompt encodes to no tokens")
    common = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p, eos_id=tok.eos_id, pad_id=tok.pad_id,
                  seed=args.seed)
    stream = lambda row, new: (sys.stdout.write(tok.decode(new)), sys.stdout.flush())  # noqa: E731
    results = {}
    for mode in (["ad", "sd"] if args.mode == "both" else [args.mode]):
        print(f"\n=== {mode.upper()} ===\n{args.prompt}", end="")
        if mode == "ad":
            res = generate_ad(pair.target, [ids], on_tokens=stream, **common)
        else:
            res = generate_sd(pair.target, pair.draft, [ids], args.gamma, on_tokens=stream, **common)
        results[mode] = res
        print(f"\n--- {res.generated} tokens in {res.seconds:.2f} s: {res.tokens_per_s:.1f} tokens/s", end="")
        if mode == "sd":
            print(f", acceptance {res.alpha_hat:.2f}, {res.tokens_per_iteration:.2f} tokens per iteration (gamma {args.gamma})", end="")
        print()
    if len(results) == 2:
        same = results["ad"].tokens == results["sd"].tokens
        print(f"SD/AD speed-up {results['sd'].tokens_per_s / results['ad'].tokens_per_s:.2f}x; outputs identical: {same}")


if __name__ == "__main__":
    main()
