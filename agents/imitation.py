"""Behaviour cloning of BALANCE into the set policy (issue 15 §1): one policy for every round size.

PPO from scratch learns slowly at large K (one seed reached 0.72x BALANCE at K = 200), so the set
policy (:mod:`agents.set_policy`) first learns BALANCE's decisions:

1. **Expert data** (:func:`collect`): rounds of the *train* stream (``envs.workload``; stage = the
   curriculum stage of K) are planned by BALANCE at draft depth ``gamma`` and the plan is replayed
   through EdgeSchedule-v0 -- the action for the user presented is reject / AD / SD@gamma as the plan
   says; every prefix of a feasible plan is feasible (downward closed), so the env's mask always
   allows it. With probability ``noise`` a random allowed action is taken instead (DART-style
   perturbation, so the policy also sees states off BALANCE's path); the label stays BALANCE's
   action for that user, or reject where the mask no longer allows it. Each decision stores only
   its observation head; the users to come are the round's user table from ``t + 1`` on.
2. **Cloning** (:func:`train_bc`): masked cross-entropy of the actor's logits
   (:meth:`SetFeaturesExtractor.forward_round` + SB3's policy MLP and action head) over a curriculum
   of K (all stages mixed, batches of one K), Adam; after every epoch the policy plays validation
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

import numpy as np

from agents.artefacts import save_model_atomic, write_text_atomic
from agents.balance import grid, split_search
from envs.config import EnvConfig
from envs.cost_model import CostModel
from envs.edge_schedule import EdgeScheduleEnv, user_features
from envs.plan import AD, SD
from envs.workload import make_rounds, sample_round, stream_seed_sequence


@dataclass
class ImitationConfig:
    """Everything a cloned policy depends on (written to ``policy.json``)."""

    num_users: int = 200  #: K of policy.json (the scheduler adapts to any K <= max_users)
    max_users: int = 500  #: look-ahead: every remaining user of rounds up to this size
    user_order: str = "slack_desc"
    expert_gamma: int = 2  #: BALANCE's draft depth in the expert plans
    noise: float = 0.1  #: probability of a random allowed action while collecting (DART)
    embed_dim: int = 32
    heads: int = 4
    pool: str = "attention"
    net_arch: list = field(default_factory=lambda: [64, 64])
    epochs: int = 12
    lr: float = 2e-3
    decisions_per_batch: int = 2048
    val_ks: list = field(default_factory=lambda: [20, 50, 100, 200])
    val_rounds: int = 20
    val_seed: int = 1000003  #: the validation stream's seed (as agents.train's eval.seed)

    def env(self, num_users: int | None = None) -> EnvConfig:
        return EnvConfig(num_users=num_users or self.num_users, max_users=self.max_users, user_order=self.user_order).validate()


def expert_action(mode: int, gamma: int) -> int:
    """The env action of a plan's mode (``Discrete(2 + G)``: reject, AD, SD@gamma)."""
    return 0 if mode not in (AD, SD) else (1 if mode == AD else 1 + gamma)


def replay_round(env: EdgeScheduleEnv, cost: CostModel, rnd, gamma: int, noise: float, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Decisions of one round with BALANCE's plan as the labels (module docstring, step 1)."""
    g = grid(0.05)
    plan = split_search(cost, rnd, gamma, g, g)
    cfg = env.cfg
    order = rnd.order(cfg.user_order)
    head = len(env.observation_space.low) - 8 * cfg.k_max
    obs, _ = env.reset(options={"round": rnd})
    heads, labels, masks = [], [], []
    for t in range(rnd.num_users):
        mask = env.action_masks()
        want = expert_action(int(plan.modes[order[t]]), gamma)
        label = want if mask[want] else 0
        heads.append(obs[:head].copy())
        labels.append(label)
        masks.append(mask)
        act = int(rng.choice(np.flatnonzero(mask))) if rng.random() < noise else label
        obs, *_ = env.step(act)
    return {"heads": np.array(heads, dtype=np.float32), "users": user_features(rnd, order, cfg), "labels": np.array(labels, dtype=np.int64),
            "masks": np.array(masks, dtype=bool), "balance_served": np.int64(plan.admitted)}


def collect(cfg: ImitationConfig, ks: list[int], rounds: list[int], out: Path, seed: int = 0) -> list[Path]:
    """Expert data per K into ``out/k{K}.npz`` (skipped when present); the train stream, stage = index of K."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for stage, (k, n) in enumerate(zip(ks, rounds, strict=True)):
        path = out / f"k{k}.npz"
        paths.append(path)
        if path.is_file():
            continue
        env_cfg = cfg.env(k)
        env = EdgeScheduleEnv(**env_cfg.to_dict())
        cost = env.cost
        noise_rng = np.random.default_rng(np.random.SeedSequence([seed, k, 7]))
        parts = []
        start = time.perf_counter()
        for i in range(n):
            rnd = sample_round(np.random.default_rng(stream_seed_sequence("train", seed, i, stage)), env_cfg)
            parts.append(replay_round(env, cost, rnd, cfg.expert_gamma, cfg.noise, noise_rng))
        data = {key: np.stack([p[key] for p in parts]) for key in parts[0]}
        tmp = path.with_suffix(".tmp.npz")
        np.savez_compressed(tmp, **data)
        tmp.replace(path)
        print(f"[imitation] K={k}: {n} rounds in {time.perf_counter() - start:.0f} s -> {path}", flush=True)
    return paths


def new_model(cfg: ImitationConfig, seed: int):
    """A MaskablePPO model with the set policy (untrained), on EdgeSchedule-v0 with ``cfg.env()``."""
    from sb3_contrib import MaskablePPO

    from agents.sb3_vec_env import EdgeScheduleSB3VecEnv
    from agents.set_policy import set_policy_kwargs

    env_cfg = cfg.env()
    env = EdgeScheduleSB3VecEnv(1, env_cfg.to_dict())
    features = {"extractor": "set", "embed_dim": cfg.embed_dim, "heads": cfg.heads, "pool": cfg.pool}
    return MaskablePPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0,
                       policy_kwargs={"net_arch": list(cfg.net_arch), **set_policy_kwargs(features, env_cfg.max_gamma)})


def play(model, cfg: ImitationConfig, k: int, rounds: int, seed: int, split: str = "validation") -> float:
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
    files = sorted(data_dir.glob("k*.npz"), key=lambda p: int(p.stem[1:]))
    if ks is not None:
        files = [f for f in files if int(f.stem[1:]) in ks]
    if not files:
        raise FileNotFoundError(f"no expert data k*.npz in {data_dir} (python -m agents.imitation collect)")
    data = [dict(np.load(f)) for f in files]
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
        start, total, correct, count = time.perf_counter(), 0.0, 0, 0
        pol.train()
        for i, rows in _batches(data, cfg.decisions_per_batch, rng):
            d = tensors[i]
            idx = torch.as_tensor(rows)
            feats = ex.forward_round(d["heads"][idx], d["users"][idx])
            logits = pol.action_net(pol.mlp_extractor.forward_actor(feats))
            logits = logits.masked_fill(~d["masks"][idx].reshape(-1, logits.shape[1]), -1e8)
            labels = d["labels"][idx].reshape(-1)
            loss = torch.nn.functional.cross_entropy(logits, labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss) * len(labels)
            correct += int((logits.argmax(-1) == labels).sum())
            count += len(labels)
        sched.step()
        pol.eval()
        val = {k: play(model, cfg, k, cfg.val_rounds, cfg.val_seed) for k in cfg.val_ks}
        score = float(np.mean(list(val.values())))
        row = {"epoch": epoch, "loss": total / count, "accuracy": correct / count, "val_served_frac": score, **{f"val_k{k}": v for k, v in val.items()},
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
            "streams": {"train": {"seed": seed, "num_users": [int(f.stem[1:]) for f in files], "rounds": [int(d["labels"].shape[0]) for d in data]},
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
    limit_threads(1)
    if args.cmd == "collect":
        collect(ImitationConfig(), [int(x) for x in args.ks.split(",")], [int(x) for x in args.rounds.split(",")], args.out, args.seed)
    else:
        print(train_bc(ImitationConfig(epochs=args.epochs), args.data, args.out, args.seed)["best_val_served_frac"])


if __name__ == "__main__":
    _main()
