"""Measure a model pair on this device and write a ``table`` profile that ``envs/`` loads.

    python -m runtime.profile --pair PATH --out envs/profiles/cpu_specsched-pair.yaml
    python -m runtime.profile --target T --draft D --device cuda --dtype float16 --out my_gpu.yaml

For both models it times one forward pass ``tau(b, q, c)`` -- batch ``b``, ``q`` new tokens per
sequence, context ``c`` (the new tokens included) -- on a grid (median of ``--repeats``), and
records weights, KV bytes per token and the config numbers the cost model needs. The device's
memory, peak matmul FLOP/s and copy bandwidth are measured too (the ``table`` latency source does
not use the last two; they document the machine). A least-squares fit
``tau = a + b * FLOPs + c * bytes`` is reported as the profile's fit to a roofline-style model.

``--engine`` (default on) then runs the batched AD and SD engines themselves on prompts of mixed
length (left padding, per-row output limits, as when serving) and records what their wall time
exceeds the table's prediction by -- per AD step and per SD iteration (with a per-draft-step part
from two draft depths) -- as the profile's ``engine`` section (``envs.profile.EngineOverhead``).
``--engine-only`` adds or refreshes just that section of an existing ``--out`` profile.

Every profile written records where it was measured (``measured_on``: CPU model or GPU name,
cores, threads, torch version, dtype, the pair's recipe hash; see ``runtime.fingerprint``).

``--quick`` calibrates an existing profile to this machine in well under two minutes: it times
both models at the points the serving engines run (``b`` 1 and 8; steps ``q`` 1 and 5, i.e. a
decode or draft step and an SD verification at gamma 4, over ``c`` 128 and 512 cached tokens; and
prefills ``q = c`` 32, 96, 160 and 320 at ``b`` 1, 4 and 8 -- a prefill is a pass over the whole
prompt, *on the diagonal* of the grid, which the full table only reaches by interpolating
off-diagonal points: on the project's pair it under-predicted the workloads' 110-160-token
prefills by ~10-20 % -- timed as the engines run it, left-padded rows with an attention mask,
which costs ~10 % more than the table's unpadded pass), divides by the profile's prediction and
writes the median ratio per model and ``q`` as the profile's ``calibration`` section
(``envs.calibration``), which every user of the profile then applies. It then re-measures the
``engine`` section against that calibration, on batches shaped like the serving workload (the
base's engine section is a residual against the *uncalibrated* table of another measurement, so
it no longer adds up once the table is scaled). ``runtime.machine_profile`` runs both on first
use and caches the result per machine:

    python -m runtime.profile --pair PATH --quick --base cpu_specsched-pair --out my_machine.yaml
    python -m runtime.profile --pair PATH --quick --out my_machine.yaml   # re-calibrate in place

The output path is checked (its folder created) before anything is measured, and so are
``--device``, ``--dtype`` and every existing profile the run adds to or keeps sections of (it must
load, and describe the pair: ``--role edge`` the draft as its ``slm``, ``--engine-only`` and
``--quick`` both models, a server rewrite that keeps an ``edge`` table the draft); profiles are
written to a temporary file and renamed: a killed run leaves the previous file intact.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from runtime.fingerprint import machine_fingerprint
from runtime.pair import ModelPair, load_pair
from runtime.pass_timing import (
    device_spec,
    model_spec,
    time_pass,
    time_prefill,
)
from runtime.profile_inputs import (
    DTYPES,
    check_device,
    check_existing_profile,
    check_out_path,
    check_pair_matches,
    read_profile,
    write_profile,
)

#: the quick calibration's points (see the module docstring)
QUICK_B, QUICK_Q, QUICK_C = (1, 8), (1, 5), (128, 512)
#: the quick calibration's prefill lengths (passes with q = c: the whole prompt at once)
QUICK_PREFILL = (32, 96, 160, 320)
#: batch sizes of the quick calibration's prefills: padding only exists in batches of several rows
QUICK_PREFILL_B = (1, 4, 8)
#: the quick profile's engine re-measurement: batch sizes, random batches per size, and the shapes
#: of the serving workload (``experiments.sim_vs_real``'s rounds: prompts up to ~160 tokens, outputs up to ~80)
QUICK_ENGINE_B, QUICK_ENGINE_TRIALS = (1, 4, 8), 3  # the residual is a small difference of two noisy times: 9 batches
QUICK_ENGINE_PROMPTS, QUICK_ENGINE_OUTPUTS = (8, 160), (8, 80)


def measure(pair: ModelPair, b_grid: Sequence[int], q_grid: Sequence[int], c_grid: Sequence[int], repeats: int, progress: bool = True) -> dict:
    out = {}
    for key, model in (("llm", pair.target), ("slm", pair.draft)):
        tau = np.zeros((len(b_grid), len(q_grid), len(c_grid)))
        points = [(i, j, k) for i in range(len(b_grid)) for j in range(len(q_grid)) for k in range(len(c_grid))]
        for i, j, k in tqdm(points, desc=f"profiling {key}", disable=not progress):
            q, c = q_grid[j], c_grid[k]
            tau[i, j, k] = time_pass(model, b_grid[i], q, max(c, q), repeats)
        out[key] = {"b": list(map(int, b_grid)), "q": list(map(int, q_grid)), "c": list(map(int, c_grid)), "tau_s": tau.tolist()}
    return out


class _Sink:
    """Collects streamed tokens, as a server's callback would."""

    def __init__(self):
        self.tokens: list[int] = []

    def __call__(self, row: int, new: list[int]) -> None:
        self.tokens.extend(new)


def measure_engine(pair: ModelPair, profile: dict, b_grid: Sequence[int], repeats: int, gammas: Sequence[int] = (2, 6), trials: int = 4, seed: int = 0, progress: bool = True,
                   prompt_tokens: tuple[int, int] = (16, 128), output_tokens: tuple[int, int] = (8, 64)) -> dict:
    """Engine overhead per batch size: engine wall time minus the cost model's prediction from
    ``profile`` (its table, and its ``calibration`` when it has one).

    For each batch size, ``trials`` random batches (prompts and outputs uniform in the inclusive
    ranges ``prompt_tokens`` and ``output_tokens``) run
    through AD and through SD at two draft depths; the per-step residuals are fitted by least
    squares, linear in ``b`` (AD: ``a0 + a1 b`` per step; SD: ``s0 + s1 b + gamma (d0 + d1 b)``
    per iteration) because one batch's residual is a small difference of two noisy times, and
    the fit is written out on ``b_grid`` (clipped at 0).
    """
    from envs.cost_model import CostModel
    from envs.profile import Profile
    from runtime.engines import generate_ad, generate_sd
    from runtime.pair import corpus

    cost = CostModel(Profile.from_dict({k: v for k, v in profile.items() if k != "engine"}, name="table"))
    text, _ = corpus(max_files=50)
    rng = np.random.default_rng(seed)
    tok = pair.tokenizer
    ad_rows, sd_rows = [], []  # (b, residual per step) and (b, gamma, residual per iteration)

    def wall(run, *args, **kwargs):
        times, res = [], None
        for _ in range(repeats + 1):  # the first is a warm-up
            start = time.perf_counter()
            res = run(*args, **kwargs)
            times.append(time.perf_counter() - start)
        return float(np.median(times[1:])), res

    for b in tqdm([b for b in b_grid for _ in range(trials)], desc="profiling engines", disable=not progress):
        starts = rng.integers(0, len(text) - 2 * prompt_tokens[1], size=b)
        # bytes -> tokens is not one-to-one after decoding: cut to the drawn length in tokens
        prompts = [(tok.encode(text[s : s + 2 * int(n)].decode("utf-8", errors="ignore")) or [0])[: int(n)]
                   for s, n in zip(starts, rng.integers(prompt_tokens[0], prompt_tokens[1] + 1, size=b), strict=True)]
        limits = [int(x) for x in rng.integers(output_tokens[0], output_tokens[1] + 1, size=b)]
        s_max, n_max = max(len(p) for p in prompts), max(limits)
        common = dict(pad_id=tok.pad_id, on_tokens=_Sink())  # a server streams every token
        t_ad, _ = wall(generate_ad, pair.target, prompts, limits, **common)
        ad_rows.append((b, (t_ad - float(cost.ad_time(b, s_max, n_max))) / max(n_max - 1, 1)))
        for g in gammas:
            t_sd, res = wall(generate_sd, pair.target, pair.draft, prompts, g, limits, **common)
            j = max(res.iterations)
            sd_rows.append((b, g, (t_sd - float(cost.sd_time(b, s_max, n_max, j, g))) / j))
    ad_x = np.array([[1.0, b] for b, _ in ad_rows])
    ad_coef = np.linalg.lstsq(ad_x, np.array([r for _, r in ad_rows]), rcond=None)[0]
    sd_x = np.array([[1.0, b, g, g * b] for b, g, _ in sd_rows])
    sd_coef = np.linalg.lstsq(sd_x, np.array([r for _, _, r in sd_rows]), rcond=None)[0]
    grid = np.asarray(list(b_grid), dtype=float)

    def on_grid(a, c):
        return [float(v) for v in np.maximum(a + c * grid, 0.0)]

    return {"b": list(map(int, b_grid)), "ad_step_s": on_grid(*ad_coef), "sd_iteration_s": on_grid(sd_coef[0], sd_coef[1]), "sd_draft_step_s": on_grid(sd_coef[2], sd_coef[3]),
            "notes": (f"engine wall time minus the {'calibrated ' if profile.get('calibration') else ''}table's prediction, fitted linear in b over {len(ad_rows)} random batches "
                      f"(prompts {prompt_tokens[0]}-{prompt_tokens[1]} tokens, outputs {output_tokens[0]}-{output_tokens[1]}, SD gamma {gammas[0]} and {gammas[1]}, {repeats} repeats, median)")}


def roofline_fit(profile: dict) -> dict:
    """Least-squares ``tau = a + b * FLOPs + c * bytes`` per model, with its relative error."""
    from scipy.optimize import nnls

    from envs.profile import ModelSpec

    fits = {}
    for key in ("llm", "slm"):
        spec = ModelSpec.from_dict(profile[key], key)
        t = profile["latency"][key]
        b, q, c = np.meshgrid(t["b"], t["q"], t["c"], indexing="ij")
        c = np.maximum(c, q)
        tau = np.asarray(t["tau_s"]).ravel()
        x = np.stack([np.ones_like(tau), spec.flops(b, q, c).ravel(), spec.bytes_moved(b, q, c).ravel()], axis=1)
        scale = x.max(axis=0)
        coef, _ = nnls(x / scale, tau)
        coef = coef / scale
        pred = x @ coef
        rel = np.abs(pred - tau) / tau
        fits[key] = {"intercept_s": float(coef[0]), "per_flop_s": float(coef[1]), "per_byte_s": float(coef[2]), "median_rel_error": float(np.median(rel)), "max_rel_error": float(rel.max()),
                     "implied_flop_s": float(1 / coef[1]) if coef[1] > 0 else None}
    return fits


def quick_calibration(pair: ModelPair, base: dict, b: Sequence[int] = QUICK_B, q: Sequence[int] = QUICK_Q, c: Sequence[int] = QUICK_C, prefill: Sequence[int] = QUICK_PREFILL, repeats: int = 3, measured_on: dict | None = None,
                      progress: bool = True, prefill_b: Sequence[int] | None = None) -> dict:
    """A ``calibration`` section for profile dict ``base``: measured / predicted pass time on this machine.

    Steps: every ``b`` x ``q`` x ``c`` point (``time_pass``); prefills: ``(b, s, s)`` for every ``b``
    in ``prefill_b`` (default: ``b``) and prompt length ``s`` in ``prefill``, timed as the engines
    run them -- left-padded rows with a mask (:func:`time_prefill`) -- since that is what the cost
    model's ``tau(b, s, s)`` stands for when serving (the scale curve's ``q`` is then ``s``). Per model and per ``q`` the
    scale is the median ratio over its points; the prediction is the base profile's own, without
    any calibration it already has. The engine overhead section is measured separately
    (:func:`quick_engine`, against the calibrated times).
    """
    prefill_b = tuple(b if prefill_b is None else prefill_b)
    if not all(int(v) >= 1 for v in (*b, *q, *c, *prefill, *prefill_b)) or not (q or prefill):
        raise ValueError(f"quick calibration points must be positive integers (b {list(b)}, q {list(q)}, c {list(c)}, prefill {list(prefill)}, prefill_b {list(prefill_b)})")
    from envs.profile import Profile

    raw = Profile.from_dict({k: v for k, v in base.items() if k != "calibration"}, name=str(base.get("name", "")))
    check_pair_matches(pair, raw, hint="calibrate a profile of this pair")
    start = time.perf_counter()
    section: dict = {"measured_on": dict(measured_on or {})}
    spread = []
    # (b, q, c, is a prefill); a step point with q = c would also be a prefill: it is timed as one
    points = [(bb, qq, max(cc, qq), False) for qq in q for bb in b for cc in c] + [(bb, s, s, True) for s in prefill for bb in prefill_b]
    curve_q = sorted({int(p[1]) for p in points})
    for key, model, tau in (("llm", pair.target, raw.tau_llm), ("slm", pair.draft, raw.tau_slm)):
        ratios: dict[int, list[float]] = {qq: [] for qq in curve_q}
        for bb, qq, cc, is_prefill in tqdm(points, desc=f"calibrating {key}", disable=not progress):
            real = time_prefill(model, bb, qq, repeats) if is_prefill else time_pass(model, bb, qq, cc, repeats)
            ratios[int(qq)].append(real / float(tau.tau(bb, qq, cc)))
        section[key] = {"q": curve_q, "scale": [float(np.median(ratios[qq])) for qq in curve_q]}
        spread += [v for r in ratios.values() for v in r]
    section["notes"] = (f"runtime.profile --quick on {time.strftime('%Y-%m-%d')}: measured / profile-predicted pass time at b {list(b)}, steps q {list(q)} "
                        f"over c {list(c)}, padded prefills q = c {list(prefill)} at b {list(prefill_b)} ({repeats} repeats, median), median per model and q; "
                        f"point ratios {min(spread):.2f}-{max(spread):.2f}; {time.perf_counter() - start:.0f} s")
    return section


def quick_engine(pair: ModelPair, calibrated: dict, repeats: int = 1, progress: bool = True) -> dict:
    """The quick profile's ``engine`` section: :func:`measure_engine` against the *calibrated*
    profile dict, at the serving workload's shapes (``QUICK_ENGINE_*``: 9 random batches, each through AD and SD at two draft depths).

    A shipped profile's engine section is its residual against its own uncalibrated table on the
    machine it was measured on; once the table is calibrated here, that residual no longer adds up
    to what the engines take here, so the quick profile measures it again.
    """
    return measure_engine(pair, calibrated, QUICK_ENGINE_B, repeats, trials=QUICK_ENGINE_TRIALS, progress=progress,
                          prompt_tokens=QUICK_ENGINE_PROMPTS, output_tokens=QUICK_ENGINE_OUTPUTS)


def _profile_path(name_or_path: str | Path) -> Path:
    from envs.profile import PROFILE_DIR

    path = Path(name_or_path)
    return path if path.suffix in (".yaml", ".yml") else PROFILE_DIR / f"{name_or_path}.yaml"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", type=Path, help="a built pair folder (target/ + draft/)")
    ap.add_argument("--target", type=Path)
    ap.add_argument("--draft", type=Path)
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument("--dtype", default="float32", choices=DTYPES)
    ap.add_argument("--b", default="1,2,4,8,16")
    ap.add_argument("--q", default="1,2,3,5,9,32,128")
    ap.add_argument("--c", default="16,64,256,512,1024")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads while measuring (a server must run with the same number)")
    ap.add_argument("--engine", action=argparse.BooleanOptionalAction, default=None,
                    help="also measure the engines' overhead (the profile's engine section; default on; with --quick at the serving shapes, against the new calibration)")
    ap.add_argument("--engine-only", action="store_true", help="measure only the engine section and write it into the existing --out profile")
    ap.add_argument("--quick", action="store_true", help="calibrate an existing profile (--base, else --out) to this machine: a calibration and an engine section, < 2 min")
    ap.add_argument("--base", default=None, help="with --quick: the profile to calibrate, a name in envs/profiles/ or a .yaml path (default: --out)")
    ap.add_argument("--name", default=None)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--role", choices=["server", "edge"], default="server",
                    help="server: both models on this device (keeps an existing edge/network section); edge: only the draft, into --out's edge section (runtime.split.role_profile)")
    args = ap.parse_args(argv)
    if args.role == "edge" and (args.quick or args.engine_only or args.base):
        raise SystemExit("--role edge measures only the edge section: no --quick, --engine-only or --base")
    if args.role == "edge" and not args.out.is_file():
        raise SystemExit(f"--role edge replaces the edge section of an existing profile: {args.out} is missing (measure --role server first, or copy the server's profile here)")
    if args.pair is None and (args.target is None or args.draft is None):
        raise SystemExit("give --pair PATH, or both --target and --draft")
    if args.quick and args.engine_only:
        raise SystemExit("--quick re-measures the engine section itself (--no-engine to keep the base's); --engine-only goes without --quick")
    if args.base is not None and not args.quick:
        raise SystemExit("--base only goes with --quick")
    grids = []
    for name in ("b", "q", "c"):
        try:
            vals = sorted({int(v) for v in getattr(args, name).split(",")})
        except ValueError:
            raise SystemExit(f"--{name} must be comma-separated positive integers") from None
        if not vals or vals[0] < 1:
            raise SystemExit(f"--{name} must be comma-separated positive integers")
        grids.append(vals)
    if args.repeats < 1:
        raise SystemExit("--repeats must be >= 1")
    if args.threads is not None:
        if args.threads < 1:
            raise SystemExit("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    check_device(args.device)
    check_out_path(args.out)
    base_path = _profile_path(args.base) if args.base is not None else args.out
    if (args.quick or args.engine_only) and not base_path.is_file():
        raise SystemExit(f"--{'quick' if args.quick else 'engine-only'} needs an existing profile at {'--base' if args.base else '--out'}, {base_path} is missing")
    # every existing profile this run adds to or keeps sections of, validated before the pair is loaded
    existing = old = None
    if args.quick or args.engine_only or args.role == "edge" or args.out.is_file():
        existing, old = read_profile(base_path, "--base" if args.base is not None else "--out")
    try:
        pair = load_pair(args.pair, device=args.device, dtype=args.dtype) if args.pair else load_pair(args.target, args.draft, device=args.device, dtype=args.dtype)
    except (FileNotFoundError, ValueError) as exc:  # not a pair folder, a missing model folder, tokenizers that differ
        raise SystemExit(f"--{'pair' if args.pair else 'target/--draft'}: {exc}") from None
    name = args.name or args.out.stem
    fingerprint = machine_fingerprint(args.device, args.dtype, torch.get_num_threads(), pair)
    if old is not None:  # a table measured on one model and priced as another's is wrong without any error
        check_existing_profile(pair, old, args.out, args.role, args.engine_only, args.quick)
    if args.role == "edge":
        from runtime.split.role_profile import edge_section, merge_edge_section

        section = edge_section(pair, args.device, args.dtype, *grids, args.repeats, fingerprint)
        write_profile(merge_edge_section(args.out, section), args.out)
        print(f"wrote the edge section of {args.out}")
        return
    if args.quick:
        profile = existing
        try:
            profile["calibration"] = quick_calibration(pair, profile, repeats=args.repeats, measured_on=fingerprint, prefill_b=QUICK_PREFILL_B)
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
        if base_path.resolve() != args.out.resolve():
            profile["name"] = name
        if args.engine is not False:  # against the calibration just measured, at the serving shapes
            profile["engine"] = quick_engine(pair, profile)
        engine_measured, args.engine = args.engine is not False, False
    elif args.engine_only:
        engine_measured = False
        profile = existing
        if profile.get("latency", {}).get("source") != "table":
            raise SystemExit(f"--engine-only needs a measured (table) profile; {args.out} has latency.source {profile.get('latency', {}).get('source')!r}")
    else:
        engine_measured = False
        profile = {
            "name": name,
            "notes": f"measured by runtime.profile on {time.strftime('%Y-%m-%d')}, device {args.device}, dtype {args.dtype}, {torch.get_num_threads()} torch thread(s), {args.repeats} repeats (median)",
            "measured_on": fingerprint,
            "device": device_spec(args.device, args.dtype),  # the matmul peak in the profile's dtype
            "llm": model_spec(pair.target, "target"),
            "slm": model_spec(pair.draft, "draft"),
            "latency": {"source": "table", **measure(pair, *grids, args.repeats)},
        }
        profile["fit"] = roofline_fit(profile)
        from runtime.split.role_profile import kept_split_sections

        profile.update(kept_split_sections(args.out))
    if args.engine is None:
        args.engine = True
    if args.engine or args.engine_only:
        profile["engine"] = measure_engine(pair, profile, grids[0], args.repeats)
        engine_measured = True
    from envs.profile import Profile

    Profile.from_dict(profile, name=name)  # validate before writing
    write_profile(profile, args.out)
    print(f"wrote {args.out}")
    if "calibration" in profile and args.quick:
        cal = profile["calibration"]
        for key in ("llm", "slm"):
            print(f"{key}: scale " + ", ".join(f"{s:.2f} at q {q}" for q, s in zip(cal[key]["q"], cal[key]["scale"], strict=True)))
        print(cal["notes"])
    if engine_measured:
        e = profile["engine"]
        print("engine overhead per b " + str(e["b"]) + ": AD step " + ", ".join(f"{x * 1e3:.2f}" for x in e["ad_step_s"]) + " ms; SD iteration "
              + ", ".join(f"{x * 1e3:.2f}" for x in e["sd_iteration_s"]) + " ms + gamma x " + ", ".join(f"{x * 1e3:.2f}" for x in e["sd_draft_step_s"]) + " ms")
    for key, fit in (profile["fit"] if not (args.quick or args.engine_only) else {}).items():
        print(f"{key}: tau = {fit['intercept_s'] * 1e3:.3f} ms + FLOPs / {fit['implied_flop_s'] or float('inf'):.3g} FLOP/s + {fit['per_byte_s']:.3g} s/byte  (median error {fit['median_rel_error'] * 100:.1f} %, max {fit['max_rel_error'] * 100:.1f} %)")


if __name__ == "__main__":
    main()
