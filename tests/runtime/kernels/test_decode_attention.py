"""decode_attention, run by Triton's interpreter on the CPU against PyTorch's attention over
the filled slots: every walk, share and split."""

import pytest
import torch

pytest.importorskip("triton")

if torch.cuda.is_available():  # conftest chose the interpreter only where there is no GPU
    pytest.skip("these check the kernels in Triton's interpreter, on a CPU-only machine", allow_module_level=True)


@pytest.mark.parametrize("fetch_ahead", [True, False], ids=["fetched-ahead", "loaded-where-used"])
@pytest.mark.parametrize("filled", [False, True], ids=["cache-shares", "filled-shares"])
@pytest.mark.parametrize("splits", [1, 2, 3, 4])
@pytest.mark.parametrize("block_t", [8, 64])
@pytest.mark.parametrize("slot", [0, 40, 63])
def test_attention_over_several_blocks_and_splits(block_t, splits, slot, filled, fetch_ahead):
    """The online softmax across blocks (BLOCK_T smaller than a program's share), walked either way
    (each next block fetched ahead, or each loaded where it is used), and the merge of
    the split programs' partials equal one softmax over the live slots; padding slots and slots past
    the step's are left out, the step's own slot counts wherever it falls (first slot, inside a
    share, last slot), whether the shares split the cache or each row's filled slots (read from the
    block that holds the row's first slot: the slots before that block are never read, live or not),
    and the arrival counters are left at zero for the next launch."""
    from pipeline.runtime.kernels.decode_attention import decode_attention
    from pipeline.runtime.kernels.tiles import AttentionConfig, attention_partials
    torch.manual_seed(2)
    b, h, t, d = 2, 2, 64, 16
    q, k, v = torch.randn(b, h * d), torch.randn(b, h, t, d), torch.randn(b, h, t, d)
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[1, :25] = False  # row 1 is left-padded
    out, arrivals = torch.empty(b, h * d), torch.zeros(b, h, dtype=torch.int32)
    config = AttentionConfig(splits, warps=4, block_t=block_t, fetch_ahead=fetch_ahead)
    partial = torch.empty(attention_partials(b, h, d, config))
    first = torch.tensor([min(20, slot), min(25, slot)])  # row 0's slots before its first are marked live
    decode_attention(q, k, v, mask, torch.tensor(slot), out, partial, arrivals, config=config,
                     first=first if filled else None)
    own = torch.arange(t) == slot  # counts even where the mask says padding
    block = min(block_t, 1 << (-(-t // splits) - 1).bit_length())  # decode_attention's BLOCK_T
    read = torch.arange(t) >= (first // block * block)[:, None] if filled else True
    live = ((mask & read & (torch.arange(t) <= slot)) | own)[:, None, None, :]
    expected = torch.nn.functional.scaled_dot_product_attention(q.view(b, h, 1, d), k, v, attn_mask=live)
    torch.testing.assert_close(out, expected.reshape(b, h * d), rtol=1e-5, atol=1e-5)
    assert not arrivals.any()
