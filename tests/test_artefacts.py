"""Artefacts survive a kill: a SIGKILL at any instant leaves a complete previous or new file."""

import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from agents.artefacts import save_model_atomic, write_bytes_atomic, write_csv_atomic

ROOT = Path(__file__).resolve().parent.parent

WRITER = """
import sys
from agents.artefacts import write_bytes_atomic
path, n = sys.argv[1], int(sys.argv[2])
payloads = [bytes([i]) * n for i in range(1, 4)]
i = 0
while True:
    write_bytes_atomic(path, payloads[i % 3])
    i += 1
"""


def test_sigkill_never_leaves_a_partial_file(tmp_path):
    path = tmp_path / "model.zip"
    n = 4_000_000  # large enough that a write takes a while
    write_bytes_atomic(path, b"\0" * n)
    rng = np.random.default_rng(0)
    for _ in range(6):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(n)], cwd=ROOT)
        time.sleep(0.3 + float(rng.uniform(0, 0.4)))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        data = path.read_bytes()
        assert len(data) == n and len(set(data[:: n // 64])) == 1, "a truncated or mixed file was left behind"
    # leftovers are hidden dot-files, never a *.zip a glob would pick up
    assert [p.name for p in tmp_path.glob("*.zip")] == ["model.zip"]


class _FailingModel:
    def save(self, f):
        f.write(b"PK partial")
        raise RuntimeError("disk full")


def test_failed_save_keeps_the_previous_model(tmp_path):
    path = tmp_path / "model.zip"
    write_bytes_atomic(path, b"previous")
    with pytest.raises(RuntimeError, match="disk full"):
        save_model_atomic(_FailingModel(), path)
    assert path.read_bytes() == b"previous" and sorted(p.name for p in tmp_path.iterdir()) == ["model.zip"]


def test_saved_model_is_a_loadable_zip(tmp_path):
    from agents.policy import algo_class
    from agents.sb3_vec_env import EdgeScheduleSB3VecEnv
    from envs import EnvConfig

    env = EdgeScheduleSB3VecEnv(2, EnvConfig(num_users=4).to_dict())
    model = algo_class("maskable_ppo")("MlpPolicy", env, seed=0, device="cpu", policy_kwargs={"net_arch": [8]})
    path = save_model_atomic(model, tmp_path / "m.zip")
    assert zipfile.is_zipfile(path)
    algo_class("maskable_ppo").load(path, device="cpu")


def test_csv_round_trip(tmp_path):
    df = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    write_csv_atomic(df, tmp_path / "sub" / "t.csv")
    assert pd.read_csv(tmp_path / "sub" / "t.csv").equals(df)
