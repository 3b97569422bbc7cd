"""The backend protocol (reset, prefill, decode), as the CPU backends implement it."""

import pytest
import torch

from pipeline.accuracy import compare_logits
from pipeline.runtime.batch import left_pad
from pipeline.runtime.dynamic.torch_eager import TorchEagerBackend
from pipeline.runtime.loader import open_backend
from pipeline.runtime.static.torch_compiled import TorchCompiledBackend
from tests.runtime.conftest import PROMPTS


@pytest.mark.parametrize("make", [TorchEagerBackend, lambda m: TorchCompiledBackend(m, "fp32", "cpu", compile=False)],
                         ids=["torch", "torch-compiled"])
def test_last_only_is_the_last_position(model, make):
    backend = make(model)
    batch = left_pad(PROMPTS, 0, torch.device("cpu"))
    outs = []
    for last_only in (False, True):
        backend.reset(3, 30)
        outs.append(backend.prefill(batch, last_only=last_only))
    assert outs[1].shape == (3, 1, model.config.vocab_size)
    assert torch.allclose(outs[1][:, 0], outs[0][:, -1], atol=1e-5)


@pytest.mark.parametrize("name", ["torch-compiled", "ort"])
def test_decode_steps_of_rows_at_different_positions_match_the_reference(exported_run, name):
    """A left-padded batch puts each row at its own position; decode steps then take only each row's
    token and position, the backend keeping which of its cache slots are real."""
    _, run, _ = exported_run
    cpu = torch.device("cpu")
    batch_of = lambda: left_pad([[464, 2068, 7586, 21831], [15496], [818, 262]], 0, cpu)  # noqa: E731
    steps = [[[11], [12], [13]], [[290], [11], [13]], [[7], [7], [7]]]
    logits = []
    for backend in (open_backend(run, "torch", "fp32", cpu), open_backend(run, name, "fp32", cpu)):
        batch = batch_of()
        backend.reset(3, 4 + len(steps))
        found = [backend.prefill(batch)[:, -1].clone()]
        position = batch.position_ids[:, -1:]
        for tokens in steps:
            position = position + 1
            found.append(backend.decode(torch.tensor(tokens), position).clone())
        logits.append(torch.stack(found))
    assert [p.tolist() for p in batch_of().position_ids[:, -1]] == [3, 0, 1]
    assert compare_logits(logits[1], logits[0])["rel_error"] < 1e-5
