"""The cores this process may run on, which every thread and process count follows."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The process's affinity (taskset, a container's cpuset), not os.cpu_count()'s host cores: counts
    taken from the host's oversubscribe a process held to fewer (ONNX Runtime's own default does so)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
