"""SD vs AD speed on the project's pair, and measured acceptance vs the i.i.d. prediction.

    python -m experiments.bench.sd_vs_ad [--pair PATH] [--gammas 2,4,6] [--new-tokens 128] [--out results/sd_vs_ad.md]

For code prompts (in-domain for the pair: high acceptance) and prose (off-domain: low), at batch 1
and 8, greedy: AD tokens/s, SD tokens/s per gamma and their ratio (measured in the same process,
so the machine's noise cancels), the per-token acceptance estimated from the run, the tokens per
iteration observed, and ``(1 - a^(g+1)) / (1 - a)`` predicted from that acceptance.
Target (issue #5): SD >= 1.5x AD on high-acceptance prompts at batch 1.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import torch

from envs.cost_model import expected_tokens_per_iteration
from runtime.engines import generate_ad, generate_sd
from runtime.pair import CODE_PROMPTS, PROSE_PROMPTS, build_pair, load_pair


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", type=Path, default=None)
    ap.add_argument("--gammas", default="2,4,6")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--temperatures", default="0,1", help="0 = greedy (outputs checked equal to AD); > 0 = sampling")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # one core: comparable, and what a small edge box has
    path = args.pair or build_pair()
    pair = load_pair(path)
    tok = pair.tokenizer
    rows = []
    for temp in (float(t) for t in args.temperatures.split(",")):
      for kind, texts in (("code", CODE_PROMPTS), ("prose", PROSE_PROMPTS)):
        for bsz in (int(b) for b in args.batches.split(",")):
            prompts = [tok.encode(texts[i % len(texts)]) for i in range(bsz)]
            kw = dict(max_new_tokens=args.new_tokens, pad_id=tok.pad_id, temperature=temp)
            generate_ad(pair.target, prompts[:1], max_new_tokens=4)  # warm-up
            ad = generate_ad(pair.target, prompts, **kw)
            for g in (int(x) for x in args.gammas.split(",")):
                sd = generate_sd(pair.target, pair.draft, prompts, g, **kw)
                if temp == 0:
                    assert sd.tokens == ad.tokens, "greedy SD must equal greedy AD"
                a = sd.alpha_hat
                rows.append({
                    "T": temp, "prompts": kind, "batch": bsz, "gamma": g,
                    "AD tokens/s": ad.tokens_per_s, "SD tokens/s": sd.tokens_per_s, "SD / AD": sd.tokens_per_s / ad.tokens_per_s,
                    "acceptance (measured)": a, "tokens/iteration (measured)": sd.tokens_per_iteration,
                    "tokens/iteration (predicted)": float(expected_tokens_per_iteration(min(a, 0.999999), g)),
                })
    df = pd.DataFrame(rows)
    meta = (path / "pair.json").read_text() if (path / "pair.json").exists() else ""
    text = "\n".join([
        "# SD vs AD on the project's pair (greedy, one CPU thread)", "",
        df.to_markdown(index=False, floatfmt=".3g"), "",
        f"T = 0 is greedy: SD's output was token-identical to AD's in every such run. T = 1 samples (exact rejection rule). Pair: `{path}`.", "",
        f"Reproduce: `python -m experiments.bench.sd_vs_ad --gammas {args.gammas} --new-tokens {args.new_tokens} --batches {args.batches} --temperatures {args.temperatures}`", "",
    ])
    print(text)
    if meta:
        print(meta)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
