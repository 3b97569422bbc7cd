"""Left padding: positions, the unpadded fast path, bad prompt arrays."""

import numpy as np
import pytest
import torch

from pipeline.errors import UserError
from pipeline.runtime.batch import left_pad
from pipeline.runtime.dynamic.torch_eager import TorchEagerBackend
from pipeline.runtime.generate import Generator
from pipeline.runtime.sampling import Sampling
from tests.runtime.conftest import PROMPTS


def test_left_pad_positions_count_real_tokens_only():
    batch = left_pad([[5, 6, 7], [8]], 0, torch.device("cpu"))
    assert batch.input_ids.tolist() == batch.host_ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert batch.attention_mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert batch.position_ids.tolist() == [[0, 1, 2], [0, 0, 0]]
    assert batch.padded and not left_pad([[5, 6], [7, 8]], 0, torch.device("cpu")).padded


def test_prompts_in_one_array_are_taken_as_the_same_lists(model):
    rows = np.array([[5, 6, 7], [8, 9, 10]], dtype=np.int32)
    got, want = left_pad(rows, 0, torch.device("cpu")), left_pad(rows.tolist(), 0, torch.device("cpu"))
    for name in ("input_ids", "attention_mask", "position_ids"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert got.padded is want.padded is False
    same_dtype = rows.astype(np.int64)
    batch = left_pad(same_dtype, 0, torch.device("cpu"))
    same_dtype[0, 0] = 99  # the caller's array is theirs: the batch holds a copy
    assert batch.host_ids[0, 0].item() == batch.input_ids[0, 0].item() == 5
    gen = Generator(TorchEagerBackend(model))
    assert gen.generate(np.array(PROMPTS[2:] * 2), Sampling(max_new_tokens=4)) == gen.generate(PROMPTS[2:] * 2, Sampling(max_new_tokens=4))
    for bad in (np.zeros((2, 0), dtype=np.int64), np.zeros(3, dtype=np.int64), np.zeros((1, 2))):
        with pytest.raises(UserError, match="prompts as an array must be integer token ids"):
            left_pad(bad, 0, torch.device("cpu"))


def test_a_batch_sends_to_the_device_only_what_a_backend_asks_for():
    """The static backends' prefill graphs copy the batch from the host: nothing is sent until a device
    tensor is asked for, and an unpadded batch's mask and positions are the shared ones, its ids sent
    only when asked for (the offline generator asks for the positions before its first token)."""
    cpu = torch.device("cpu")
    unpadded = left_pad([[5, 6], [7, 8]], 0, cpu)
    assert unpadded.position_ids.tolist() == [[0, 1], [0, 1]] and unpadded.attention_mask.tolist() == [[1, 1], [1, 1]]
    assert unpadded.sent_ids is None and unpadded.sent is None
    assert unpadded.input_ids.tolist() == [[5, 6], [7, 8]] and unpadded.sent_ids is not None
    padded = left_pad([[5, 6, 7], [8]], 0, cpu)
    assert padded.sent is None and padded.host.is_contiguous()
    assert padded.position_ids.tolist() == [[0, 1, 2], [0, 0, 0]] and padded.sent is not None
