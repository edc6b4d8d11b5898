"""Behaviour cloning of BALANCE into the set policy (issue 15 §1): one policy for every round size.

PPO from scratch learns slowly at large K (one seed reached 0.72x BALANCE at K = 200), so the set
policy (:mod:`agents.set_policy`) first learns BALANCE's decisions:

1. **Expert plans** (:func:`collect`): rounds of the *train* stream (``envs.workload``; stage = the
   curriculum stage of K) are planned by BALANCE at draft depth ``expert_gamma`` (2: BALANCE serves
   more at 2 than at the paper's 4 on these workloads) and by two greedy admissions in the policy's
   user order (SD first, AD first); the plan serving the most users is the expert's (BALANCE on
   ties; :func:`decisions` then prefers a greedy plan that ties: its actions are a function of the
   mask, the easiest to imitate). The expert is at least BALANCE on every training round.
   :func:`decisions` replays each plan through EdgeSchedule-v0 -- the action for the user presented
   is reject / AD / SD@gamma as the plan says; every prefix of a feasible plan is feasible (downward
   closed), so the env's mask always allows it. With probability ``noise`` the action taken flips
   between the label and reject (DART-style perturbation, so the policy also sees states off the
   expert's path); the label stays the expert's action for that user, or reject where the mask no
   longer allows it. Each decision stores only its observation head; the users to come are the
   round's user table from ``t + 1`` on.
2. **Cloning** (:func:`train_bc`): masked cross-entropy of the actor's logits
   (:meth:`SetFeaturesExtractor.forward_round` + SB3's policy MLP and action head) over a curriculum
   of K (all stages mixed, batches of one K; the decisions where the expert rejects an admissible
   user weighted by ``reject_weight``), Adam; after every epoch the policy plays validation
   rounds (the *validation* stream, never test) at each K and the best epoch (mean served fraction
   over the K) is kept.
3. The result is an ordinary MaskablePPO ``model.zip`` + ``policy.json`` (+ ONNX), loadable by
   ``agents.evaluate policy_path=...`` and fine-tunable by PPO.

    python -m agents.imitation collect --out runs/general/data --ks 20,50,100,200 --rounds 1500,400,150,60
    python -m agents.imitation train --data runs/general/data --out runs/general/seed0 --seed 0
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from agents.artefacts import save_model_atomic, write_text_atomic
from agents.balance import grid, split_search
from envs.config import EnvConfig
from envs.cost_model import CostModel
from envs.edge_schedule import EdgeScheduleEnv, user_features
from envs.plan import AD, SD
from envs.workload import Round, make_rounds, sample_round, stream_seed_sequence

if TYPE_CHECKING:  # sb3_contrib loads torch: imported where a model is made
    from sb3_contrib import MaskablePPO


@dataclass
class ImitationConfig:
    """Everything a cloned policy depends on (written to ``policy.json``)."""

    num_users: int = 200  #: K of policy.json (the scheduler adapts to any K <= max_users)
    max_users: int = 500  #: look-ahead: every remaining user of rounds up to this size
    user_order: str = "slack_desc"
    expert_gamma: int = 2  #: BALANCE's draft depth in the expert plans
    prefer_greedy: bool = True  #: on ties with the expert plan, imitate a greedy admission instead
    noise: float = 0.05  #: probability of a random allowed action while collecting (DART)
    embed_dim: int = 32
    heads: int = 4
    pool: str = "attention"
    net_arch: list = field(default_factory=lambda: [64, 64])
    epochs: int = 8
    lr: float = 2e-3
    reject_weight: float = 2.0  #: loss weight of the decisions where the expert rejects an admissible user (rare, and they decide the quality)
    decisions_per_batch: int = 200
    val_ks: list = field(default_factory=lambda: [20, 50, 100, 200])
    val_rounds: int = 20
    val_seed: int = 1000003  #: the validation stream's seed (as agents.train's eval.seed)

    def env(self, num_users: int | None = None) -> EnvConfig:
        return EnvConfig(num_users=num_users or self.num_users, max_users=self.max_users, user_order=self.user_order).validate()


def expert_action(mode: int, gamma: int) -> int:
    """The env action of a plan's mode (``Discrete(2 + G)``: reject, AD, SD@gamma)."""
    return 0 if mode not in (AD, SD) else (1 if mode == AD else 1 + gamma)


def greedy_modes(env: EdgeScheduleEnv, rnd: Round, first: int, second: int) -> np.ndarray:
    """Modes (original order) of admitting each user with action ``first`` if allowed, else ``second``, else reject."""
    env.reset(options={"round": rnd})
    for _ in range(rnd.num_users):
        m = env.action_masks()
        *_, term, _, info = env.step(first if m[first] else (second if m[second] else 0))
    return np.asarray(info["modes"], dtype=np.int8)


def expert_modes(env: EdgeScheduleEnv, cost: CostModel, rnd: Round, gamma: int) -> tuple[np.ndarray, int]:
    """The expert's plan for a round: the best of BALANCE at depth ``gamma`` and the two greedy
    admissions in the policy's user order (SD@gamma first, AD first); ties go to BALANCE. Returns the
    modes (original order) and BALANCE's number served."""
    g = grid(0.05)
    balance = split_search(cost, rnd, gamma, g, g).modes.astype(np.int8)
    best = balance
    for first, second in ((1 + gamma, 1), (1, 1 + gamma)):
        modes = greedy_modes(env, rnd, first, second)
        if (modes != 0).sum() > (best != 0).sum():
            best = modes
    return best, int((balance != 0).sum())


def replay_round(env: EdgeScheduleEnv, rnd: Round, modes: np.ndarray, gamma: int, noise: float, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Decisions of one round with the expert plan ``modes`` as the labels (module docstring, step 1).

    With probability ``noise`` the action taken flips between the label and reject (admit instead
    of reject only where the mask allows the expert's mode), so the states leave the expert's path
    without ever fixing another draft depth."""
    cfg = env.cfg
    order = rnd.order(cfg.user_order)
    head = len(env.observation_space.low) - 8 * cfg.k_max
    obs, _ = env.reset(options={"round": rnd})
    heads, labels, masks = [], [], []
    for t in range(rnd.num_users):
        mask = env.action_masks()
        want = expert_action(int(modes[order[t]]), gamma)
        label = want if mask[want] else 0
        heads.append(obs[:head].copy())
        labels.append(label)
        masks.append(mask)
        act = label
        if rng.random() < noise:
            alt = 1 + gamma if mask[1 + gamma] else (1 if mask[1] else 0)
            act = 0 if label else alt
        obs, *_ = env.step(act)
    return {"heads": np.array(heads, dtype=np.float32), "users": user_features(rnd, order, cfg), "labels": np.array(labels, dtype=np.int64), "masks": np.array(masks, dtype=bool)}


def _train_round(env_cfg: EnvConfig, seed: int, stage: int, i: int):
    """Round ``i`` of training sub-stream ``stage`` of the train stream ``seed``."""
    return sample_round(np.random.default_rng(stream_seed_sequence("train", seed, i, stage)), env_cfg)


def collect(cfg: ImitationConfig, ks: list[int], rounds: list[int], out: Path, seed: int = 0) -> list[Path]:
    """Expert plans per K into ``out/plans_k{K}.npz`` (skipped when present): train stream ``seed``, stage = index of K."""
    if len(ks) != len(rounds) or not ks or min(ks) < 1 or min(rounds) < 1 or not 0 <= seed < 2**32:
        raise ValueError(f"collect needs one rounds count >= 1 per K >= 1 and a seed in [0, 2**32), got ks={ks}, rounds={rounds}, seed={seed}")
    for k in ks:
        cfg.env(k)  # K out of the env's range fails here, before any plan is computed
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for stage, (k, n) in enumerate(zip(ks, rounds, strict=True)):
        path = out / f"plans_k{k}.npz"
        paths.append(path)
        if path.is_file():
            with np.load(path) as old:
                held = (old["modes"].shape, int(old["seed"]), int(old["stage"]), int(old["gamma"]))
            if held == ((n, k), seed, stage, cfg.expert_gamma):
                continue  # an earlier run's plans for exactly this request
            # a file from another request (rounds, seed, stage or depth) must not be taken for this one
            raise ValueError(f"{path} holds plans of another request ((rounds, K), seed, stage, gamma) = {held}, not "
                             f"{((n, k), seed, stage, cfg.expert_gamma)}: move it away or collect into another --out")
        env_cfg = cfg.env(k)
        env = EdgeScheduleEnv(**env_cfg.to_dict())
        start = time.perf_counter()
        plans = [expert_modes(env, env.cost, _train_round(env_cfg, seed, stage, i), cfg.expert_gamma) for i in range(n)]
        expert = np.stack([m for m, _ in plans])
        tmp = path.with_suffix(".tmp.npz")
        np.savez_compressed(tmp, modes=expert, balance_served=np.array([b for _, b in plans]), seed=seed, stage=stage, gamma=cfg.expert_gamma)
        tmp.replace(path)
        print(f"[imitation] K={k}: {n} rounds in {time.perf_counter() - start:.0f} s, expert {(expert != 0).sum() / (n * k):.4f} "
              f"vs BALANCE {np.mean([b for _, b in plans]) / k:.4f} served -> {path}", flush=True)
    return paths


def decisions(cfg: ImitationConfig, plans_dir: Path, noise_seed: int, ks: list[int] | None = None) -> list[dict[str, np.ndarray]]:
    """The expert plans of ``plans_dir`` replayed into labelled decisions, one dict of stacked arrays per K."""
    files = sorted(plans_dir.glob("plans_k*.npz"), key=lambda p: int(p.stem[7:]))
    files = [f for f in files if ks is None or int(f.stem[7:]) in ks]
    if not files:
        raise FileNotFoundError(f"no expert plans plans_k*.npz in {plans_dir} (python -m agents.imitation collect)")
    rng = np.random.default_rng(np.random.SeedSequence([noise_seed, 7]))
    out = []
    for f in files:
        d = np.load(f)
        k = int(f.stem[7:])
        env_cfg = cfg.env(k)
        env = EdgeScheduleEnv(**env_cfg.to_dict())
        gamma = int(d["gamma"])
        parts = []
        for i, modes in enumerate(d["modes"]):
            rnd = _train_round(env_cfg, int(d["seed"]), int(d["stage"]), i)
            if cfg.prefer_greedy:
                # a greedy plan that serves as many as the expert's is the easier one to imitate (a function of the mask)
                for first, second in ((1 + gamma, 1), (1, 1 + gamma)):
                    g = greedy_modes(env, rnd, first, second)
                    if (g != 0).sum() >= (modes != 0).sum():
                        modes = g
                        break
            parts.append(replay_round(env, rnd, modes, gamma, cfg.noise, rng))
        out.append({"k": k, **{key: np.stack([p[key] for p in parts]) for key in parts[0]}})
    return out


def new_model(cfg: ImitationConfig, seed: int) -> MaskablePPO:
    """A MaskablePPO model with the set policy (untrained), on EdgeSchedule-v0 with ``cfg.env()``."""
    from sb3_contrib import MaskablePPO

    from agents.sb3_vec_env import EdgeScheduleSB3VecEnv
    from agents.set_policy import set_policy_kwargs

    env_cfg = cfg.env()
    env = EdgeScheduleSB3VecEnv(1, env_cfg.to_dict())
    features = {"extractor": "set", "embed_dim": cfg.embed_dim, "heads": cfg.heads, "pool": cfg.pool}
    return MaskablePPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0,
                       policy_kwargs={"net_arch": list(cfg.net_arch), **set_policy_kwargs(features, env_cfg.max_gamma)})


def play(model: MaskablePPO, cfg: ImitationConfig, k: int, rounds: int, seed: int, split: str = "validation") -> float:
    """Mean served fraction of the policy (cached actor) on ``rounds`` rounds of ``split`` at K = ``k``."""
    from agents.set_policy_fast import CachedSetActor

    actor = CachedSetActor(model)
    env_cfg = cfg.env(k)
    env = EdgeScheduleEnv(**env_cfg.to_dict())
    served = []
    for rnd in make_rounds(env_cfg, rounds, seed, split=split):
        actor.reset()
        obs, _ = env.reset(options={"round": rnd})
        term = False
        while not term:
            obs, _, term, _, info = env.step(actor.act(obs, env.action_masks()))
        served.append(info["served"])
    return float(np.mean(served)) / k


def _batches(data: list[dict[str, np.ndarray]], per_batch: int, rng: np.random.Generator):
    """(K-index, round indices) batches of about ``per_batch`` decisions, in random order."""
    out = []
    for i, d in enumerate(data):
        r, t = d["labels"].shape
        step = max(1, per_batch // t)
        perm = rng.permutation(r)
        out += [(i, perm[j : j + step]) for j in range(0, r, step)]
    return [out[j] for j in rng.permutation(len(out))]


def train_bc(cfg: ImitationConfig, data_dir: Path, out: Path, seed: int, ks: list[int] | None = None) -> dict:
    """Clone the expert data in ``data_dir`` into a policy folder ``out`` (model.zip = best validation epoch)."""
    import torch

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    data = decisions(cfg, data_dir, seed, ks)
    tensors = [{key: torch.as_tensor(d[key]) for key in ("heads", "users", "labels", "masks")} for d in data]
    model = new_model(cfg, seed)
    pol = model.policy
    ex = pol.features_extractor
    params = list(ex.parameters()) + list(pol.mlp_extractor.policy_net.parameters()) + list(pol.action_net.parameters())
    opt = torch.optim.Adam(params, lr=cfg.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg.epochs)
    out.mkdir(parents=True, exist_ok=True)
    log, best = [], -1.0
    for epoch in range(cfg.epochs):
        start, total, correct, count, hard, hard_ok = time.perf_counter(), 0.0, 0, 0, 0, 0
        pol.train()
        for i, rows in _batches(data, cfg.decisions_per_batch, rng):
            d = tensors[i]
            idx = torch.as_tensor(rows)
            feats = ex.forward_round(d["heads"][idx], d["users"][idx])
            logits = pol.action_net(pol.mlp_extractor.forward_actor(feats))
            logits = logits.masked_fill(~d["masks"][idx].reshape(-1, logits.shape[1]), -1e8)
            labels = d["labels"][idx].reshape(-1)
            rejects = (labels == 0) & d["masks"][idx].reshape(-1, logits.shape[1])[:, 1:].any(-1)
            weight = 1.0 + (cfg.reject_weight - 1.0) * rejects.float()
            loss = (torch.nn.functional.cross_entropy(logits, labels, reduction="none") * weight).sum() / weight.sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(labels)
            pred = logits.argmax(-1)
            correct += int((pred == labels).sum())
            count += len(labels)
            hard += int(rejects.sum())
            hard_ok += int((pred[rejects] == 0).sum())
        sched.step()
        pol.eval()
        val = {k: play(model, cfg, k, cfg.val_rounds, cfg.val_seed) for k in cfg.val_ks}
        score = float(np.mean(list(val.values())))
        row = {"epoch": epoch, "loss": total / count, "accuracy": correct / count, "reject_recall": hard_ok / max(hard, 1), "val_served_frac": score, **{f"val_k{k}": v for k, v in val.items()},
               "epoch_s": time.perf_counter() - start}
        log.append(row)
        print(f"[imitation] seed {seed} " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
        if score > best:
            best = score
            save_model_atomic(model, out / "model.zip")
    import pandas as pd

    from agents.artefacts import write_csv_atomic

    write_csv_atomic(pd.DataFrame(log), out / "progress.csv")
    meta = {"algo": "maskable_ppo", "env_id": "EdgeSchedule-v0", "env": cfg.env().to_dict(), "seed": seed, "threads": 1,
            "trained_by": "agents.imitation: behaviour cloning of BALANCE", "imitation": {k: v for k, v in cfg.__dict__.items()},
            "streams": {"train": {"plans": str(data_dir), "num_users": [int(d["k"]) for d in data], "rounds": [int(d["labels"].shape[0]) for d in data]},
                        "validation": {"seed": cfg.val_seed, "rounds": cfg.val_rounds, "num_users": list(cfg.val_ks), "used_for": "epoch selection (model.zip)"}}}
    write_text_atomic(out / "policy.json", json.dumps(meta, indent=2))
    from agents.export import export_onnx

    export_onnx(out)
    return {"best_val_served_frac": best, "epochs": log}


def _main(argv: list[str] | None = None) -> None:
    from agents.threads import limit_threads

    p = argparse.ArgumentParser(prog="python -m agents.imitation", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--ks", default="20,50,100,200")
    c.add_argument("--rounds", default="1500,400,150,60")
    c.add_argument("--seed", type=int, default=0)
    t = sub.add_parser("train")
    t.add_argument("--data", type=Path, required=True)
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--epochs", type=int, default=ImitationConfig.epochs)
    args = p.parse_args(argv)
    if not 0 <= args.seed < 2**32:
        p.error(f"--seed must be an integer in [0, 2**32), got {args.seed}")
    limit_threads(1)
    if args.cmd == "collect":
        try:
            ks, rounds = [int(x) for x in args.ks.split(",")], [int(x) for x in args.rounds.split(",")]
        except ValueError:
            p.error(f"--ks and --rounds must be comma-separated integers, got {args.ks!r} and {args.rounds!r}")
        try:
            collect(ImitationConfig(), ks, rounds, args.out, args.seed)
        except ValueError as exc:
            p.error(str(exc))
    else:
        if args.epochs < 1:
            p.error(f"--epochs must be >= 1, got {args.epochs}")
        print(train_bc(ImitationConfig(epochs=args.epochs), args.data, args.out, args.seed)["best_val_served_frac"])


if __name__ == "__main__":
    _main()
