"""Artefacts that survive a kill: every file is written beside its target and renamed over it.

``os.replace`` is atomic on POSIX, so a SIGKILL at any instant leaves either the previous
complete file or the new complete file -- never a truncated zip or a half-written CSV. The
temporary name starts with a dot and ends in ``.tmp`` so that globbing ``*.zip`` / ``*.csv``
never picks up a partial file.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import pandas as pd


def check_writable(path: str | Path, field: str, directory: bool = False) -> Path:
    """``path`` if a run could write it (a file, or with ``directory`` a folder, created with its
    parents as the atomic writers do); else ValueError naming ``field``. Meant for the start of an
    entry point, so that a bad output path is refused before the long work, not after it.

    The nearest existing ancestor must be a folder in which a file can be created (tried with a
    temporary file that is removed at once: permission bits alone say nothing for root, or for
    /proc); nothing else is created."""
    import tempfile

    path = Path(path)
    if not directory and (path.is_dir() or not path.name):
        raise ValueError(f"{field} must name a file, got the folder {str(path)!r}")
    if directory and path.exists() and not path.is_dir():
        raise ValueError(f"{field} must be a folder, got the file {str(path)!r}")
    probe = path if directory else path.parent
    probe = probe.absolute()
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise ValueError(f"{field}: {str(path)!r} cannot be created, {str(probe)!r} is a file")
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as exc:
        raise ValueError(f"{field}: {str(path)!r} cannot be written ({exc.strerror or exc} in {str(probe)!r})") from None
    return path


def require_writable(path: str | Path, flag: str, directory: bool = False) -> Path:
    """:func:`check_writable` for a command line: its refusal ends the program (SystemExit with the
    message naming ``flag``), before the command's work starts."""
    try:
        return check_writable(path, flag, directory)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def _tmp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` (fsynced temp file, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_path(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_text_atomic(path: str | Path, text: str) -> Path:
    return write_bytes_atomic(path, text.encode())


def write_csv_atomic(df: pd.DataFrame, path: str | Path, **kwargs: Any) -> Path:
    """``df.to_csv(path)`` (``index=False`` unless given), atomically."""
    kwargs.setdefault("index", False)
    return write_text_atomic(path, df.to_csv(**kwargs))


def save_figure_atomic(fig: Any, path: str | Path, dpi: int = 120) -> Path:
    """``fig.savefig(path)`` for a matplotlib figure (format from the suffix), atomically; closes it."""
    import matplotlib.pyplot as plt

    path = Path(path)
    buf = io.BytesIO()
    fig.savefig(buf, dpi=dpi, format=path.suffix.lstrip(".") or "png")
    plt.close(fig)
    return write_bytes_atomic(path, buf.getvalue())


def save_model_atomic(model: Any, path: str | Path) -> Path:
    """``model.save(path)`` for a stable-baselines3 model, atomically (SB3 itself writes in place)."""
    buf = io.BytesIO()
    model.save(buf)
    return write_bytes_atomic(path, buf.getvalue())
