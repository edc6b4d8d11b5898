"""What a profiling run is given, checked before it measures (``runtime.profile``'s inputs), and
how it writes its profile (:func:`write_profile`).

Loading a real pair takes minutes and measuring it more: every check here fails before that, with
a message naming the flag -- the output path, the device and dtype, and every existing profile the
run adds to or keeps sections of (it must load, and describe the pair being measured: a table
measured on one model and priced as another's is wrong without any error).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import yaml

from runtime.pair import ModelPair

if TYPE_CHECKING:
    from envs.profile import Profile


def check_pair_matches(pair: ModelPair, profile: Profile, roles: tuple[str, ...] = ("target", "draft"), hint: str = "measure a profile of this pair") -> None:
    """``ValueError`` unless the pair's models are the ones ``profile`` (a ``Profile``) describes:
    the target its ``llm``, the draft its ``slm`` (parameter and layer counts). A table measured on
    one model and priced as another's is wrong without any error, so every writer that adds to an
    existing profile (``--quick``, ``--engine-only``, ``--role edge``) checks this first."""
    for key in roles:
        model, section = (pair.target, "llm") if key == "target" else (pair.draft, "slm")
        spec = getattr(profile, section)
        params = int(sum(p.numel() for p in model.parameters()))
        if params != int(spec.params) or int(model.config.num_hidden_layers) != spec.layers:
            raise ValueError(f"the pair's {key} ({params} parameters, {model.config.num_hidden_layers} layers) is not the profile's "
                             f"{section} ({int(spec.params)} parameters, {spec.layers} layers): {hint}")


def check_out_path(path: Path) -> None:
    """Fail now, not after minutes of measuring: the folder is created and proven writable."""
    if path.suffix not in (".yaml", ".yml"):
        raise SystemExit(f"--out must be a .yaml file path (profiles are loaded by that suffix), got {path}")
    if path.is_dir():
        raise SystemExit(f"--out {path} is a folder; give a .yaml file path")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".probe")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise SystemExit(f"--out {path}: cannot write a file there ({exc.strerror or exc})") from None


#: the dtypes a profile is measured in, by torch's canonical names: the fingerprint records the
#: string as given, and ``float`` / ``half`` would differ from ``float32`` / ``float16`` there
DTYPES = ("float32", "float16", "bfloat16")


def check_device(device: str) -> None:
    """Fail now, not after loading the weights (minutes for a real pair): cpu, cuda or cuda:N, present here."""
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise SystemExit(f"--device must be cpu, cuda or cuda:N, got {device!r}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit(f"--device {device}: CUDA is not available on this machine")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise SystemExit(f"--device {device}: this machine has CUDA devices cuda:0 to cuda:{torch.cuda.device_count() - 1}")


def read_profile(path: Path, flag: str) -> tuple[dict, Profile]:
    """``(dict, Profile)`` of the profile at ``path``, validated -- before the pair is loaded and
    anything measured (it used to be read after the measurement: a broken file cost the whole run)."""
    from envs.profile import Profile

    try:
        data = yaml.safe_load(path.read_text())
        return data, Profile.from_dict(data, name=path.stem)
    except (OSError, yaml.YAMLError, ValueError) as exc:
        raise SystemExit(f"{flag} {path} is not a valid profile: {exc}") from None


def check_existing_profile(pair: ModelPair, old: Profile, out: Path, role: str, engine_only: bool, quick: bool) -> None:
    """Refuse (``SystemExit``) a run that would add to or keep a section of ``old`` (a ``Profile``)
    measured on other models than ``pair``'s: ``--role edge`` writes the draft's table as the
    profile's slm; ``--engine-only``'s residual is engine time minus the profile's tables; a server
    rewrite keeps a measured edge table, timed for the old slm (``--quick`` checks its own base)."""
    hint = "measure a profile of this pair (--role server) first"
    if role == "edge":
        roles = ("draft",)
    elif engine_only:
        roles = ("target", "draft")
    elif not quick and old.edge is not None and old.edge.latency_source == "table":
        roles, hint = ("draft",), f"its edge section times that model; remove the edge section from {out} (or the file) to measure this pair"
    else:
        return
    try:
        check_pair_matches(pair, old, roles, hint=hint)
    except ValueError as exc:
        raise SystemExit(f"--out {out}: {exc}") from None


class _PlainDumper(yaml.SafeDumper):
    """A safe dumper that writes a list shared by two fields twice, not as ``&id001`` / ``*id001``:
    a profile is read and edited by people (the quick calibration's curves share one ``q`` list)."""

    def ignore_aliases(self, data) -> bool:
        return True


def write_profile(profile: dict, out: Path) -> None:
    """Write atomically: a temporary file beside ``out``, flushed to disk, renamed over it (no YAML
    anchors: shared objects are written out in full)."""
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(yaml.dump(profile, Dumper=_PlainDumper, sort_keys=False, width=200))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
