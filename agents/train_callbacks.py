"""What happens during training besides learning: validation against BALANCE, and checkpoints.

* :class:`ValidationEvaluation` plays the policy (deterministic, masked) on a fixed set of
  **validation** rounds in one vector env. It chooses ``model.zip`` and nothing else: published
  tables use the disjoint test stream (``envs.workload``). :class:`ValidationEvaluationV1` does
  the same on EdgeSchedule-v1 against BALANCE-ED.
* :class:`ValidateAndCheckpoint` evaluates every ``eval_freq`` timesteps (logging the timestep
  with each evaluation, so learning curves have an x axis), keeps the best policy as
  ``model.zip``, and writes a resumable checkpoint every ``checkpoint_freq`` timesteps. Every
  file is written atomically.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

from agents.artefacts import save_model_atomic
from agents.evaluate import evaluate_schedulers
from envs.config import EnvConfig
from envs.workload import make_rounds


class ValidationEvaluation:
    """The policy on ``rounds`` validation rounds from ``seed``; BALANCE's score on them is the reference."""

    def __init__(self, env: EnvConfig, rounds: int, seed: int, draft_depth: int, masked: bool):
        self.rounds = make_rounds(env, rounds, seed, split="validation")
        self.venv = self._vector_env(env, len(self.rounds))
        self.balance_served = self._reference_served(env, seed, draft_depth)
        self.masked = masked

    @staticmethod
    def _vector_env(env: EnvConfig, num_envs: int):
        from envs.edge_schedule_vector import EdgeScheduleVectorEnv

        return EdgeScheduleVectorEnv(num_envs=num_envs, **env.to_dict())

    def _reference_served(self, env: EnvConfig, seed: int, draft_depth: int) -> float:
        # BALANCE's users served on the realised values (not just admitted: they differ under noise)
        balance = evaluate_schedulers(env, ["balance"], rounds=self.rounds, seed=seed, draft_depth=draft_depth)
        return float(balance.served.mean())

    def __call__(self, model) -> tuple[float, float]:
        """(served fraction, ratio to BALANCE) of ``model`` on the validation rounds."""
        obs, _ = self.venv.reset(seed=0, options={"rounds": self.rounds})
        served = None
        for _ in range(self.venv.cfg.num_users):
            if self.masked:
                actions, _ = model.predict(obs, action_masks=self.venv.action_masks(), deterministic=True)
            else:
                actions, _ = model.predict(obs, deterministic=True)
            obs, _, term, _, info = self.venv.step(actions)
            if term.all():
                served = info["served"]
        mean = float(np.mean(served))
        return mean / self.venv.cfg.num_users, mean / max(self.balance_served, 1e-9)


class ValidationEvaluationV1(ValidationEvaluation):
    """The same validation on EdgeSchedule-v1 rounds (AD, SD and ED users), against BALANCE-ED."""

    @staticmethod
    def _vector_env(env: EnvConfig, num_envs: int):
        from envs.edge_schedule_v1_vector import EdgeScheduleV1VectorEnv

        return EdgeScheduleV1VectorEnv(num_envs=num_envs, **env.to_dict())

    def _reference_served(self, env: EnvConfig, seed: int, draft_depth: int) -> float:
        from agents.evaluate_v1 import REFERENCE_V1, evaluate_schedulers_v1

        ref = evaluate_schedulers_v1(env, [REFERENCE_V1], rounds=self.rounds, seed=seed, draft_depth=draft_depth)
        return float(ref.served.mean())


def checkpoint_path(folder: Path, timesteps: int) -> Path:
    """SB3's checkpoint naming, so ``resume=`` takes either kind."""
    return folder / f"model_{timesteps}_steps.zip"


class ValidateAndCheckpoint(BaseCallback):
    """Validation every ``eval_freq`` timesteps (0: only when called) and checkpoints every ``checkpoint_freq`` (0: none)."""

    def __init__(self, out: Path, evaluation: ValidationEvaluation | None, eval_freq: int, checkpoint_freq: int, start: int = 0):
        super().__init__()
        self.out = out
        self.evaluation = evaluation
        self.eval_freq = eval_freq
        self.checkpoint_freq = checkpoint_freq
        self.best = -1.0
        # first thresholds after ``start`` (a resumed run keeps the original schedule)
        self.next_eval = (start // eval_freq + 1) * eval_freq if eval_freq > 0 else None
        self.next_checkpoint = (start // checkpoint_freq + 1) * checkpoint_freq if checkpoint_freq > 0 else None

    def _on_step(self) -> bool:
        n = self.num_timesteps
        if self.next_eval is not None and self.evaluation is not None and n >= self.next_eval:
            while self.next_eval <= n:
                self.next_eval += self.eval_freq
            self.evaluate()
        if self.next_checkpoint is not None and n >= self.next_checkpoint:
            while self.next_checkpoint <= n:
                self.next_checkpoint += self.checkpoint_freq
            save_model_atomic(self.model, checkpoint_path(self.out / "checkpoints", n))
        return True

    def evaluate(self) -> None:
        """Validate now; the policy becomes ``model.zip`` if it is the best so far."""
        if self.evaluation is None:
            return
        frac, ratio = self.evaluation(self.model)
        self.logger.record("eval/served_frac", frac)
        self.logger.record("eval/ratio_to_balance", ratio)
        # the x axis of every learning curve: evaluation rows carry their own timestep
        self.logger.record("time/total_timesteps", self.num_timesteps)
        if frac > self.best:
            self.best = frac
            save_model_atomic(self.model, self.out / "model.zip")
        self.logger.dump(self.num_timesteps)
