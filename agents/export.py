"""Export a trained policy to ONNX for the runtime: ``(obs, mask) -> action``.

The exported graph is the deterministic policy with the mask applied to the logits
(``where(mask, logits, -1e8)``) and an argmax, so the runtime needs neither torch nor SB3 --
only onnxruntime. ``python -m agents.export DIR`` writes ``DIR/policy.onnx``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from agents.masked_policy import MaskedArgmax
from agents.policy import algo_class, resolve_policy_path


def export_onnx(path: str | Path, out: str | Path | None = None) -> Path:
    model_path, meta = resolve_policy_path(path)
    model = algo_class(meta["algo"]).load(model_path, device="cpu")
    module = MaskedArgmax(model, use_mask=meta["algo"] == "maskable_ppo").eval()  # as PolicyScheduler runs it
    obs_dim = model.observation_space.shape[0]
    n_actions = int(model.action_space.n)
    out = Path(out) if out else model_path.parent / "policy.onnx"
    example = (torch.zeros(1, obs_dim), torch.ones(1, n_actions))
    tmp = out.with_suffix(".onnx.tmp")
    torch.onnx.export(module, example, str(tmp), input_names=["obs", "mask"], output_names=["action"], dynamic_axes={"obs": {0: "batch"}, "mask": {0: "batch"}, "action": {0: "batch"}}, opset_version=17, dynamo=False)
    import onnx

    onnx.checker.check_model(str(tmp))
    tmp.replace(out)
    return out


class OnnxPolicy:
    """Runs an exported policy with onnxruntime: ``act(obs, mask) -> actions``."""

    def __init__(self, path: str | Path):
        import onnxruntime as ort

        self.session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def act(self, obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        obs = np.atleast_2d(obs).astype(np.float32)
        mask = np.atleast_2d(mask).astype(np.float32)
        return self.session.run(["action"], {"obs": obs, "mask": mask})[0]


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(prog="python -m agents.export", description="Export a trained policy folder's model.zip to ONNX (policy.onnx beside it).")
    ap.add_argument("policy_dir", help="a policy folder (model.zip + policy.json) or its model.zip")
    args = ap.parse_args()
    try:
        print(export_onnx(args.policy_dir))
    except (FileNotFoundError, ValueError) as exc:  # a missing or malformed policy: one line, not a traceback
        raise SystemExit(f"agents.export: {exc}") from None
