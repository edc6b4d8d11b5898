"""Live scheduling server: OpenAI-compatible completions with deadlines, planned by any scheduler.

    python -m runtime.serve scheduler=balance port=8011
    python -m runtime.serve scheduler=policy policy_path=policies/paper_k50 window_s=1.0
    python -m runtime.serve target=PATH draft=PATH profile=PATH.yaml     # any local Hugging Face pair and profile
    python -m runtime.serve scheduler=balance_ed placement=split profile=split_cpu1_specsched-pair split.port=50051 split.cohorts=2 split.window_ms=5

The parts, one concept each:

- :mod:`runtime.serve_config` -- every setting, validated in full before anything is loaded;
- :mod:`runtime.api` -- HTTP: OpenAI schemas (:mod:`runtime.openai_schemas`), limits, errors, streaming;
- :mod:`runtime.rounds` -- the queue, deadline-aware admission, the round loop, faults, shutdown;
- :mod:`runtime.round_runner` -- one round: planning it, running its batches, learning the calibration;
- :mod:`runtime.executor` -- running a plan's AD / SD batches (time-slicing or two devices);
- :mod:`runtime.calibration` -- real / predicted step time per mode, scaling the profile;
- :mod:`runtime.metrics` -- Prometheus counters, histograms and gauges;
- :mod:`runtime.split_rounds` / :mod:`runtime.split_placement` -- ``placement=split``: edge users over gRPC
  (``split.port``) beside the HTTP users, every round planned with a v1 scheduler (``balance_ed``,
  ``edge_first`` or a v1 policy such as ``policies/split_k20``), ED users verified by the split verifier
  (:mod:`runtime.split`: cohorts taking turns, a ``split.window_ms`` batching window); the edge's side
  is ``python -m runtime.edge --placement on``;
- this module -- the process: uvicorn, SIGTERM, the command line.

**SIGTERM** (or Ctrl-C): the server stops admitting (503), rejects every queued request with
reason ``shutdown``, lets the running round finish for up to ``shutdown_timeout_s``, then ends the
remaining streams with an outcome and exits; the whole shutdown is bounded by that timeout (plus
~2 s for connections to close).

**Two devices** (``devices=[cuda:0,cuda:1]``, or ``[cpu,cpu]``): the AD batch runs on the first
(its own copy of the target), the SD batch on the second (target + draft), at the same time. The
plan is still made for one shared device, so it is conservative. On CPU the two "devices" split
the cores (``torch`` threads = cores / 2 each, unless ``threads`` is set).

**CPU threads.** On a small CPU the HTTP stack competes with torch's OpenMP threads;
``threads=1`` with the one-thread profile (``profile=cpu1_specsched-pair``) gives steadier timings.
"""

from __future__ import annotations

import logging
import socket
from typing import TYPE_CHECKING

import uvicorn

from envs.config import refuse_renamed_keys, refuse_renamed_overrides
from runtime.api import ServeApp, create_app
from runtime.executor import run_parallel, run_shared
from runtime.header_timeout import header_timeout_protocol
from runtime.rounds import RoundServer
from runtime.serve_config import ServeConfig

if TYPE_CHECKING:
    from runtime.pair import ModelPair

__all__ = ["ServeConfig", "ServeApp", "RoundServer", "SpecSchedServer", "create_app", "make_server", "run_parallel", "run_shared", "main"]

GRACE_S = 2.0  #: after the rounds are done, connections get this long to send their last bytes




class SpecSchedServer(uvicorn.Server):
    """uvicorn, with the round server shut down first (reject the queue, bounded wait for the
    running round), before uvicorn waits for connections: so shutdown never plans queued requests
    and is bounded by ``shutdown_timeout_s``."""

    def __init__(self, app: ServeApp, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        cfg = app.cfg
        super().__init__(uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on", http=header_timeout_protocol(cfg.header_timeout_s),
                                        timeout_graceful_shutdown=GRACE_S, timeout_keep_alive=5))
        self.serve_app = app

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self.serve_app.rounds.shutdown()
        await super().shutdown(sockets)

    @property
    def url(self) -> str:
        host, port = self.servers[0].sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"


def make_server(cfg: ServeConfig, pair: ModelPair | None = None, log_level: str = "warning") -> SpecSchedServer:
    """A ready-to-run server (config validated, pair loaded unless given); ``run()`` serves until
    SIGTERM / Ctrl-C or ``should_exit``."""
    return SpecSchedServer(create_app(cfg, pair), host=cfg.host, port=cfg.port, log_level=log_level)


def config_from_hydra(values: dict) -> ServeConfig:
    refuse_renamed_keys(values, "serve")
    known = set(ServeConfig.__dataclass_fields__)
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown serve config key(s) {unknown}; known: {sorted(known)}")
    return ServeConfig(**values).validate()


def main() -> None:
    import sys

    import hydra
    from omegaconf import OmegaConf

    @hydra.main(version_base="1.3", config_path="../conf", config_name="serve")
    def app(raw) -> None:
        values = OmegaConf.to_container(raw, resolve=True)
        cfg = config_from_hydra(values)  # everything checked before the pair is built or loaded
        if cfg.host not in ("127.0.0.1", "localhost", "::1"):
            logging.getLogger("specsched.serve").warning("listening on %s, not loopback", cfg.host)
        import torch

        if cfg.threads is not None:
            torch.set_num_threads(cfg.threads)
        elif cfg.devices and all(d == "cpu" for d in cfg.devices):
            import os

            torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))  # the two "devices" split the cores
        make_server(cfg, log_level="info").run()

    refuse_renamed_overrides(sys.argv[1:], "serve")
    app()


if __name__ == "__main__":
    main()
