"""The ping-pong KV buffers of the contract-graph backends."""

import pytest
import torch

from pipeline.contract import Contract
from pipeline.runtime.dynamic.kv_buffers import PingPongKV


def test_ping_pong_buffers_swap_and_bound():
    kv = PingPongKV(Contract(n_layer=1, n_head=3, head_dim=4, vocab_size=10), torch.float32, torch.device("cpu"),
                    torch.float32)
    kv.reset(2, 10)
    past, present = kv.step(2, 6)
    assert past[0].shape == (2, 3, 0, 4) and present[1].shape == (2, 3, 6, 4)
    first = present[0].data_ptr()
    kv.advance()
    past, present = kv.step(2, 1)
    assert past[0].data_ptr() == first and present[0].shape == (2, 3, 7, 4)
    kv.advance()
    with pytest.raises(ValueError, match="to length 11"):
        kv.step(2, 4)
