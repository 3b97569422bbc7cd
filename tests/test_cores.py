import os

import pytest

from pipeline.cores import usable_cores


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="process affinity is Linux's")
def test_the_usable_cores_are_the_processs_affinity_not_the_hosts():
    every = os.sched_getaffinity(0)
    assert usable_cores() == len(every) <= os.cpu_count()
    try:
        os.sched_setaffinity(0, set(sorted(every)[:1]))  # as under taskset or a container's cpuset
        assert usable_cores() == 1
    finally:
        os.sched_setaffinity(0, every)
