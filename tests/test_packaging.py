"""Packaging: a lean core install, extras for everything else, and a lock that satisfies the ranges.

`pip install .` must give a researcher the environment and the analytic schedulers without torch,
Hydra or the serving stack, so SpecSched installs beside other tools; `requirements.lock` is what
CI and scripts/setup.sh install, so it must pin every declared dependency inside its range.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]


def _lock() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, version = line.partition("==")
        assert version, f"requirements.lock: {line!r} is not an exact pin (name==version)"
        pins[canonicalize_name(name)] = Version(version)
    return pins


def _declared() -> list[Requirement]:
    reqs = [Requirement(r) for r in PROJECT["dependencies"]]
    for extra in PROJECT["optional-dependencies"].values():
        reqs += [Requirement(r) for r in extra]
    return [r for r in reqs if canonicalize_name(r.name) != "specsched"]


def test_core_install_is_lean():
    core = {canonicalize_name(Requirement(r).name) for r in PROJECT["dependencies"]}
    assert core == {"gymnasium", "numpy", "scipy", "pyyaml"}


def test_extras_cover_learning_runtime_tracking_slurm_and_dev():
    extras = PROJECT["optional-dependencies"]
    assert {"learn", "runtime", "track", "slurm", "dev", "all"} <= set(extras)
    names = {k: {canonicalize_name(Requirement(r).name) for r in v} for k, v in extras.items()}
    assert {"torch", "stable-baselines3", "sb3-contrib", "hydra-core"} <= names["learn"]
    assert {"transformers", "fastapi", "prometheus-client", "grpcio"} <= names["runtime"]
    assert {"wandb", "tensorboard"} <= names["track"]
    assert "hydra-submitit-launcher" in names["slurm"]
    # the openai client only drives the server in tests
    assert "openai" in names["dev"]
    assert all("openai" not in v for k, v in names.items() if k != "dev")


def test_every_declared_dependency_is_locked_inside_its_range():
    lock = _lock()
    for req in _declared():
        name = canonicalize_name(req.name)
        assert name in lock, f"{req.name} is declared in pyproject.toml but not pinned in requirements.lock"
        assert req.specifier.contains(lock[name], prereleases=True), (
            f"requirements.lock pins {req.name}=={lock[name]}, outside the declared range {req.specifier}"
        )


def test_the_environment_imports_without_the_learning_or_serving_stack():
    heavy = ["torch", "pandas", "matplotlib", "hydra", "stable_baselines3", "transformers", "fastapi", "wandb"]
    code = (
        "import sys, gymnasium as gym, envs, agents.balance, agents.baselines, agents.optimal\n"
        "env = gym.make('EdgeSchedule-v0', num_users=5)\n"
        "env.reset(seed=0)\n"
        f"print(','.join(m for m in {heavy!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"a lean install would fail: importing the environment pulled in {out.stdout.strip()}"


@pytest.mark.parametrize("script", ["scripts/setup.sh"])
def test_setup_installs_from_the_lock(script):
    text = (ROOT / script).read_text()
    assert "-c requirements.lock" in text and '".[all,dev]"' in text


def test_the_wheel_ships_the_profiles(tmp_path):
    """A plain `pip install .` must be able to load every shipped profile by name: they are package
    data of `envs` (envs/profiles/), not files beside the checkout."""
    import shutil
    import zipfile

    from envs.profile import PROFILE_DIR

    # build from a copy: setuptools writes build/ and *.egg-info beside the sources it builds
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for pkg in ("envs", "agents", "runtime", "experiments"):
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(src)],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    (wheel,) = tmp_path.glob("specsched-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {f"envs/profiles/{p.name}" for p in PROFILE_DIR.glob("*.yaml")}
    assert shipped and shipped <= names, sorted(shipped - names)
