"""A live server for tests: the cached tiny pair, a profile with its dimensions, loopback, an
ephemeral port, started and stopped inside the test (a context manager)."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def tiny_pair():
    from runtime.pair import build_pair, load_pair

    return load_pair(build_pair(recipe="tiny", progress=False))


def tiny_profile(pair, folder: Path, base: str = "cpu1_specsched-pair", name: str = "tiny_test") -> Path:
    """The shipped profile ``base``'s timings (default: the one-thread CPU profile) with the tiny
    pair's dimensions (the server refuses a profile of other dimensions), saved as ``name``; slower
    than the tiny pair really is, which only makes planning conservative until the calibration has
    learnt the real speed."""
    prof = yaml.safe_load((ROOT / "envs" / "profiles" / f"{base}.yaml").read_text())
    for role, model in (("llm", pair.target), ("slm", pair.draft)):
        c = model.config
        prof[role].update(layers=c.num_hidden_layers, hidden=c.hidden_size, heads=c.num_attention_heads, kv_heads=c.num_key_value_heads,
                          vocab=c.vocab_size, head_dim=c.hidden_size // c.num_attention_heads)
    prof["name"] = name
    path = Path(folder) / f"{name}.yaml"
    path.write_text(yaml.safe_dump(prof))
    return path


@contextlib.contextmanager
def running(pair, profile: Path, **overrides):
    """Yields the started :class:`runtime.serve.SpecSchedServer`; stops it (and waits) on exit."""
    from runtime.serve import ServeConfig, make_server

    cfg = ServeConfig(**{"scheduler": "balance", "port": 0, "window_s": 0.2, "max_tokens_limit": 64, "max_prompt_tokens": 256,
                         "default_deadline_s": 20.0, "profile": str(profile), **overrides})
    srv = make_server(cfg, pair)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    for _ in range(600):
        if srv.started or not thread.is_alive():
            break
        time.sleep(0.05)
    assert srv.started, "the test server did not start within 30 s"
    try:
        yield srv
    finally:
        srv.should_exit = True
        thread.join(timeout=60)
        assert not thread.is_alive(), "the test server did not stop within 60 s"
