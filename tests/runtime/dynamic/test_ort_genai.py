"""The ort-genai backend runs onnxruntime-genai on the ort target's folder as the ort backends run
ONNX Runtime: on the cores this process may use."""

import os
import re

import pytest
import torch

from pipeline.contract import ORT
from pipeline.errors import UserError
from pipeline.export.genai_config import CONFIG_FILE
from pipeline.runtime.loader import open_backend
from tests.conftest import copy_run

CPU = torch.device("cpu")


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def threads_started_opening(run, cores: set[int]) -> int:
    """Threads a new ort-genai backend starts while this thread may run on `cores` only (threads
    started from it inherit that, as in a container limited to those cores)."""
    every = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        before = threads()
        backend = open_backend(run, "ort-genai", "fp32", CPU)
        started = threads() - before
        del backend  # its threads end with it
        return started
    finally:
        os.sched_setaffinity(0, every)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs a Linux machine with two cores or more")
def test_onnxruntime_genai_takes_one_thread_a_core_this_process_may_run_on(exported_run):
    pytest.importorskip("onnxruntime_genai", reason="the onnxruntime-genai test needs the [dev] extra")
    _, run, _ = exported_run
    open_backend(run, "ort-genai", "fp32", CPU)  # onnxruntime-genai starts threads of its own with its first model
    two = set(sorted(os.sched_getaffinity(0))[:2])
    # intra-op threads: the caller's own and a pool worker for each further core (onnxruntime-genai's
    # default ran one thread, half the speed on two cores: docs/journal/performance.md)
    assert threads_started_opening(run, two) == 1
    assert threads_started_opening(run, {min(two)}) == 0


@pytest.mark.parametrize("config", [None, '{"model": '], ids=["missing", "truncated"])
def test_a_missing_or_broken_genai_config_is_one_line_naming_the_folder(exported_run, tmp_path, config):
    pytest.importorskip("onnxruntime_genai", reason="the onnxruntime-genai test needs the [dev] extra")
    _, run, _ = exported_run
    run = copy_run(run, tmp_path / "run")
    path = run.onnx("fp32", ORT) / CONFIG_FILE
    path.unlink() if config is None else path.write_text(config)
    message = f"^{re.escape(str(path.parent))}: onnxruntime-genai cannot load it .*rerun `gpt2-deploy export --force`$"
    with pytest.raises(UserError, match=message):
        open_backend(run, "ort-genai", "fp32", CPU)
