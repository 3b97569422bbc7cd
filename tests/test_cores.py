import os

import pytest
import torch

from pipeline import cores
from pipeline.cores import hold_torch_to_usable_cores, usable_cores


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="process affinity is Linux's")
def test_the_usable_cores_are_the_processs_affinity_not_the_hosts():
    every = os.sched_getaffinity(0)
    assert usable_cores() == len(every) <= os.cpu_count()
    try:
        os.sched_setaffinity(0, set(sorted(every)[:1]))  # as under taskset or a container's cpuset
        assert usable_cores() == 1
    finally:
        os.sched_setaffinity(0, every)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="process affinity is Linux's")
def test_a_cpu_quota_cuts_the_usable_cores_and_torchs_threads_rounded_up(monkeypatch):
    affinity, threads = len(os.sched_getaffinity(0)), torch.get_num_threads()
    monkeypatch.setattr(cores, "cpu_quota", lambda: affinity + 0.5)
    assert usable_cores() == affinity  # a quota above the cores allowed leaves them
    monkeypatch.setattr(cores, "cpu_quota", lambda: 0.5)
    assert usable_cores() == 1
    try:
        hold_torch_to_usable_cores()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
