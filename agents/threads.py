"""How many CPU threads torch and the numeric libraries may use: a deliberate choice, not the default.

torch's default is one intra-op thread per core, and its OpenMP threads spin while waiting. On a
shared machine or Slurm node with other CPU-bound processes beside it, the small networks of a
scheduling policy then run *slower* than on one thread: the threads fight the neighbours for
cores (``results/train_speed.md`` measures it). The policies here are MLPs of a few hundred
units fed batches of tens of rows, which one thread runs at full speed, so training and
evaluation default to ``threads: 1``; raise it only on a machine of your own.
"""

from __future__ import annotations

import os
import sys

#: variables read by OpenMP, MKL, OpenBLAS and numexpr when they start (child processes too)
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")


def limit_threads(threads: int) -> int:
    """Use ``threads`` CPU threads (>= 1) in torch and in libraries or processes started from now on.

    Returns the number torch reports afterwards (``threads`` if torch is not loaded yet: it reads
    ``OMP_NUM_THREADS`` on import). ``torch.set_num_interop_threads`` can only be set
    before torch's first parallel work, so it is attempted and otherwise left as it is.
    """
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    for var in THREAD_ENV_VARS:
        os.environ[var] = str(threads)
    if "torch" not in sys.modules:
        return threads  # torch reads OMP_NUM_THREADS when it is first imported: no need to load it now
    import torch

    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(threads)
    except RuntimeError:
        pass  # already fixed by earlier torch work in this process
    return torch.get_num_threads()
