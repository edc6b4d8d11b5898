"""Turn any stable-baselines3 model trained on EdgeSchedule-v0 (e.g. by rl-zoo3) into a policy folder.

    python -m agents.import_sb3 logs/zoo/ppo/EdgeSchedule-v0_1/best_model.zip --out policies/zoo_ppo
    python -m agents.import_sb3 MODEL.zip --algo maskable_ppo --env-kwargs '{"num_users": 12}' --out DIR
    python -m agents.evaluate policy_path=DIR env.num_users=12

A policy folder is what :class:`agents.policy.PolicyScheduler` (``agents.evaluate policy_path=``)
loads: ``model.zip`` (the SB3 file, copied byte for byte) and ``policy.json`` (the algorithm and the
environment config the model observes), plus ``policy.onnx`` unless ``--no-onnx``.

The environment config is the one the model was trained with: ``--env-kwargs`` (JSON), else, for a
model inside an rl-zoo3 log folder, the ``env_kwargs`` rl-zoo3 saved beside it
(``<run>/EdgeSchedule-v0/config.yml``), else the defaults of ``EdgeSchedule-v0``. The algorithm is
``--algo``, else the rl-zoo3 folder name (``logs/<algo>/<env>_<n>/``). Before anything is written
the model is loaded and checked against that config: its observation and action spaces must be the
ones the env builds (an error names the fields that shape them), and one masked forward pass must
run. Files are written atomically; nothing is left half-written.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

import yaml

from agents.artefacts import write_bytes_atomic, write_text_atomic
from agents.policy import ALGOS, algo_class
from envs import ENV_ID
from envs.config import EnvConfig
from envs.edge_schedule import observation_size


class PolicyImportError(ValueError):
    """The model cannot become a policy folder; the message says why and what to pass."""


class _ZooLoader(yaml.SafeLoader):
    """rl-zoo3 saves its config as a pickled OrderedDict: read that one tag, nothing else executable."""


_ZooLoader.add_constructor(
    "tag:yaml.org,2002:python/object/apply:collections.OrderedDict",
    lambda loader, node: dict(loader.construct_sequence(node, deep=True)[0]),
)


def zoo_config(model_path: Path) -> dict[str, Any] | None:
    """The hyperparameters rl-zoo3 saved beside ``model_path`` (``<run>/<env>/config.yml``), or None
    when the model is not in an rl-zoo3 log folder."""
    config = model_path.parent / ENV_ID / "config.yml"
    if not config.is_file():
        return None
    saved = yaml.load(config.read_text(), Loader=_ZooLoader) or {}
    return saved if isinstance(saved, dict) else dict(saved)


def zoo_run_info(model_path: Path, config: dict[str, Any] | None = None) -> tuple[str | None, dict[str, Any] | None]:
    """(algo, env_kwargs) from an rl-zoo3 log folder around ``model_path``, else (None, None);
    ``config``: its :func:`zoo_config`, when the caller has read it already."""
    config = zoo_config(model_path) if config is None else config
    if config is None:
        return None, None
    folder = model_path.parent.parent.name
    return (folder if folder in ALGOS else None), dict(config.get("env_kwargs") or {})


def normalisation_problem(model_path: Path, config: dict[str, Any] | None) -> str | None:
    """Why ``model_path`` cannot be imported as it is, if it was trained behind ``VecNormalize``: its
    policy acts on normalised observations, and a policy folder carries no normalisation statistics,
    so the imported scheduler would act on raw ones (silently other actions). ``config``: its
    :func:`zoo_config`. None if not."""
    run = model_path.parent
    stats = [p for p in (run / "vecnormalize.pkl", run / ENV_ID / "vecnormalize.pkl") if p.is_file()]
    if stats:
        return f"it was trained with VecNormalize ({stats[0]})"
    if config is not None and config.get("normalize") not in (None, False, "False", "false"):
        return f"its rl-zoo3 config has normalize: {config.get('normalize')!r} ({run / ENV_ID / 'config.yml'})"
    return None


def _check_model(model, cfg: EnvConfig, algo: str) -> None:
    obs_shape = getattr(model.observation_space, "shape", None)
    want = (observation_size(cfg),)
    if obs_shape != want:
        raise PolicyImportError(
            f"the model observes {obs_shape}, but EdgeSchedule-v0 with these env kwargs gives {want} "
            f"(max_users={cfg.max_users}, num_users={cfg.num_users}, max_gamma={cfg.max_gamma}): pass --env-kwargs as in training"
        )
    n = getattr(model.action_space, "n", None)
    if n != 2 + cfg.max_gamma:
        raise PolicyImportError(f"the model has action space {model.action_space}, the env Discrete({2 + cfg.max_gamma}) (max_gamma={cfg.max_gamma})")
    import torch

    from agents.masked_policy import MaskedArgmax

    try:
        net = MaskedArgmax(model).eval()
        with torch.no_grad():
            net(torch.zeros(1, want[0]), torch.ones(1, 2 + cfg.max_gamma))
    except (AttributeError, RuntimeError) as err:
        raise PolicyImportError(f"a {algo} policy cannot be run as a masked argmax policy: {err}") from None


def import_sb3(model_path: str | Path, out: str | Path, algo: str | None = None, env_kwargs: dict[str, Any] | None = None, onnx: bool = True) -> Path:
    """Write policy folder ``out`` from SB3 model ``model_path``; returns ``out``."""
    model_path = Path(model_path)
    if not model_path.is_file():
        raise PolicyImportError(f"no model file at {model_path}")
    config = zoo_config(model_path)
    problem = normalisation_problem(model_path, config)
    if problem:
        raise PolicyImportError(f"{model_path} cannot be imported: {problem}; policy folders carry no observation "
                                "normalisation, so it would act on raw observations. Train without normalize (conf/rl_zoo3/ppo.yml does)")
    zoo_algo, zoo_kwargs = zoo_run_info(model_path, config)
    algo = algo or zoo_algo
    if algo is None:
        if zoo_kwargs is not None:  # an rl-zoo3 folder, named after an algorithm policy folders do not run
            raise PolicyImportError(f"{model_path} is in an rl-zoo3 folder of algorithm {model_path.parent.parent.name!r}; "
                                    f"policy folders run {list(ALGOS)} (pass --algo for one of those)")
        raise PolicyImportError(f"--algo is needed: {model_path} is not inside an rl-zoo3 log folder")
    try:
        algo_class(algo)
    except ValueError as err:
        raise PolicyImportError(f"--algo: {err}") from None
    kwargs = env_kwargs if env_kwargs is not None else (zoo_kwargs or {})
    try:
        cfg = EnvConfig.from_kwargs(**kwargs)
    except ValueError as err:
        raise PolicyImportError(f"--env-kwargs: {err}") from None
    try:
        model = algo_class(algo).load(model_path, device="cpu")
    except Exception as err:  # SB3 raises many kinds (KeyError, ValueError, pickle errors) for a foreign zip
        raise PolicyImportError(f"{model_path} does not load as a {algo} model: {type(err).__name__}: {err}") from None
    _check_model(model, cfg, algo)

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = model_path.read_bytes()
    meta = {
        "algo": algo,
        "env": cfg.to_dict(),
        "source": {
            "model": str(model_path),
            "sha256": hashlib.sha256(data).hexdigest(),
            "env_kwargs_from": "--env-kwargs" if env_kwargs is not None else ("rl-zoo3 config.yml" if zoo_kwargs is not None else "EdgeSchedule-v0 defaults"),
            "imported_by": "agents.import_sb3",
        },
    }
    write_bytes_atomic(out / "model.zip", data)
    write_text_atomic(out / "policy.json", json.dumps(meta, indent=2))
    if onnx:
        from agents.export import export_onnx

        export_onnx(out)
    return out


def _main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agents.import_sb3", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="the SB3 model .zip")
    parser.add_argument("--out", required=True, help="the policy folder to write")
    parser.add_argument("--algo", help="the algorithm that saved the model (default: from the rl-zoo3 folder)")
    parser.add_argument("--env-kwargs", type=json.loads, default=None, help="JSON: the EdgeSchedule-v0 kwargs of training (default: rl-zoo3's config.yml)")
    parser.add_argument("--no-onnx", action="store_true", help="skip policy.onnx")
    args = parser.parse_args(argv)
    if args.env_kwargs is not None and not isinstance(args.env_kwargs, dict):
        parser.error("--env-kwargs must be a JSON object, e.g. '{\"num_users\": 12}'")
    try:
        out = import_sb3(args.model, args.out, algo=args.algo, env_kwargs=args.env_kwargs, onnx=not args.no_onnx)
    except PolicyImportError as err:
        raise SystemExit(f"error: {err}") from None
    meta = json.loads((out / "policy.json").read_text())
    print(f"{out}: {meta['algo']} policy for K={meta['env']['num_users']} (look-ahead {meta['env']['max_users'] or meta['env']['num_users']}); "
          f"evaluate with: python -m agents.evaluate schedulers=[balance,policy] policy_path={out} env.num_users={meta['env']['num_users']}")


if __name__ == "__main__":
    _main()
