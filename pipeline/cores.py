"""The cores this process may run on, which every thread and process count follows."""

from __future__ import annotations

import math
import os

from pipeline.cgroups import cpu_quota


def usable_cores() -> int:
    """The process's affinity (taskset, a container's cpuset), cut to its control groups' CPU quota
    (a container's --cpus) rounded up, not os.cpu_count()'s host cores: counts taken from the host
    oversubscribe a process held to fewer (ONNX Runtime's own default does so)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cpu_quota()
    return cores if quota is None else max(1, min(cores, math.ceil(quota)))


def hold_torch_to_usable_cores() -> None:
    """torch's intra-op threads cut to usable_cores() where a CPU quota binds (torch's own default
    follows the affinity only); for each process that computes: the command, serve's engine."""
    if cpu_quota() is None:
        return
    import torch

    torch.set_num_threads(min(torch.get_num_threads(), usable_cores()))
