"""The ORT backend on the ort target's graph: left-padded prompts moved to the left edge of a shared
KV buffer, the LM head over the last positions only, and decode steps in place, all matching
PyTorch; each cache shape keeps its own buffers."""

import torch

from pipeline.accuracy import compare_logits
from pipeline.contract import ORT
from pipeline.model import load_checkpoint
from pipeline.runtime.batch import left_pad
from pipeline.runtime.dynamic.torch_eager import TorchEagerBackend
from pipeline.runtime.loader import open_backend

CPU = torch.device("cpu")
PROMPTS = [[464, 2068, 7586, 21831, 18045, 625, 262], [15496, 995], [818, 262, 3726, 286]]


def run_both(run, prompts, last_only: bool, steps: int = 3):
    """Prefill logits and `steps` decode steps' logits of the fused backend and of eager PyTorch."""
    found = []
    for backend in (open_backend(run, "ort-fused", "fp32", CPU), TorchEagerBackend(load_checkpoint(run.checkpoint))):
        batch = left_pad(prompts, 0, CPU)
        rows, width = batch.host_ids.shape
        backend.reset(rows, width + steps)
        logits = [backend.prefill(batch, last_only=last_only).clone()]
        position = batch.position_ids[:, -1:]
        for step in range(steps):
            position = position + 1
            logits.append(backend.decode(torch.full((rows, 1), 13 + step), position).clone())
        found.append(logits)
    return found


def test_padded_prompts_and_decode_steps_match_pytorch(exported_run):
    _, run, _ = exported_run
    ours, ref = run_both(run, PROMPTS, last_only=False)
    mask = left_pad(PROMPTS, 0, CPU).attention_mask
    assert compare_logits(ours[0], ref[0], mask)["rel_error"] < 1e-5
    for step, (a, b) in enumerate(zip(ours[1:], ref[1:])):
        assert compare_logits(a, b)["rel_error"] < 1e-5, step


def test_the_last_position_alone_is_the_full_prefill_s_last_column(exported_run):
    """last_only runs the LM head over the columns from the shortest row's last token on."""
    _, run, _ = exported_run
    backend = open_backend(run, "ort-fused", "fp32", CPU)
    batch = left_pad(PROMPTS, 0, CPU)
    backend.reset(3, 12)
    full = backend.prefill(batch, last_only=False).clone()
    backend.reset(3, 12)
    last = backend.prefill(batch, last_only=True)
    assert last.shape == (3, 1, full.shape[-1])
    assert torch.allclose(last, full[:, -1:], atol=1e-5)
    unpadded = left_pad(torch.tensor(PROMPTS[0]).expand(2, -1).numpy(), 0, CPU)
    backend.reset(2, 12)
    assert backend.prefill(unpadded).shape == (2, 1, full.shape[-1])


def test_each_cache_shape_keeps_its_buffers_and_a_reset_clears_the_mask(exported_run):
    _, run, _ = exported_run
    backend = open_backend(run, "ort-fused", "fp32", CPU)
    assert backend.contract.target == ORT and backend.contract.shared_kv
    backend.reset(2, 16)
    backend.prefill(left_pad(PROMPTS[:2], 0, CPU))
    assert backend.cache.mask.sum().item() == len(PROMPTS[0]) + len(PROMPTS[1])
    backend.reset(2, 16)
    assert backend.cache.mask.sum().item() == 0
    backend.reset(1, 8)
    assert list(backend.caches) == [(1, 8)]  # on a CPU nothing captured reads the old shape's buffers
