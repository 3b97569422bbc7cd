"""The decode kernels compiled for a GPU: the products over one-byte weights, int8 converted to fp16
by its bits (inline PTX, which the interpreter cannot run; tests/runtime/static/test_triton_backend.py
checks the same kernels interpreted, converting plainly) and fp8, against dequantise-then-matmul;
attention's walks at the shapes that take them, against PyTorch's attention."""

import dataclasses

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU: on a CPU tests/runtime/static/test_triton_backend.py runs these kernels interpreted",
                allow_module_level=True)
from pipeline.int8_weights import quantize_rows  # noqa: E402
from pipeline.runtime.kernels.decode_attention import decode_attention  # noqa: E402
from pipeline.runtime.kernels.linear_kernels import fused_linear  # noqa: E402
from pipeline.runtime.kernels.tiles import LinearConfig, attention_config, attention_partials  # noqa: E402

DEVICE = torch.device("cuda")


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn, torch.float16], ids=["int8", "fp8", "fp16"])
# row products, then tiles of 16 rows, then wider tiles; the tuned ones, and with the weights the left operand
@pytest.mark.parametrize("rows, weights_left", [(1, False), (8, False), (64, False), (8, True), (64, True)])
@pytest.mark.parametrize("width, residual", [(768, False), (1024, False), (1600, False), (1600, True)])
def test_one_byte_weights_equal_dequantise_then_matmul(dtype, rows, width, residual, weights_left):
    """(fp16 weights: 64 rows of a product 1,024 or 1,600 wide take the 64-row tiles of x normalised
    apart, six stages deep, at 1,600 with the weights on the left. weights-left: the tiles with the
    weights as the left operand, which Hopper reads from registers.)"""
    torch.manual_seed(0)
    n, k = (width, 4 * width) if residual else (3 * width, width)
    w = torch.randn(n, k, device=DEVICE) * 0.02
    w[0, :8] = torch.tensor([-0.5, 0.5, -0.25, 0.25, 0.0, 0.1, -0.1, 0.3])  # both signs and zero, and the row's extreme
    if dtype == torch.float16:
        q, scale = w.half(), torch.ones(n, device=DEVICE)
    else:
        q, scale = quantize_rows(w, dtype)
        assert q.dtype == dtype and q.float().abs().amax(-1).eq(127 if dtype == torch.int8 else 448).all()
    x = torch.randn(rows, k, device=DEVICE).half()
    out = torch.zeros(rows, n, device=DEVICE, dtype=torch.float32 if residual else torch.float16)
    config = LinearConfig(16 if rows <= 16 else 64, 64, 64, 5 if residual else 1, weights_left=True) if weights_left else None
    fused_linear(x, q, out, bias=torch.zeros(n, device=DEVICE, dtype=torch.float16), residual=residual,
                 scale=None if dtype == torch.float16 else scale, config=config)
    expected = x.float() @ (q.float() * scale[:, None]).t()
    torch.testing.assert_close(out.float(), expected, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("rows, heads", [(64, 12), (64, 16), (64, 25), (8, 25), (1, 25)])
@pytest.mark.parametrize("walk", ["tuned", "other walk"])
@pytest.mark.parametrize("filled", [False, True], ids=["offline", "filled"])
def test_attention_at_the_tuned_shares_matches_pytorch(rows, heads, walk, filled):
    """Each batch's tuned shares, offline and the serving scheduler's FILLED ones, as tuned and with
    the other walk (each next block fetched ahead, or each loaded where it is used), over a 256-slot
    fp16 cache at slot 191 with left-padded rows; FILLED with each row read from its own first slot,
    0-127 slots in."""
    torch.manual_seed(0)
    length, d, slot = 256, 64, 191
    q = torch.randn(rows, heads * d, device=DEVICE).half()
    k, v = (torch.randn(rows, heads, length, d, device=DEVICE).half() for _ in "kv")
    first = torch.randint(0, 128, (rows,), device=DEVICE) if filled else None
    mask = torch.ones(rows, length, dtype=torch.bool, device=DEVICE)
    if filled:
        mask &= torch.arange(length, device=DEVICE)[None, :] >= first[:, None]
    else:
        mask[::3, :40] = False
    config = attention_config(rows, heads=heads, filled=filled)
    if walk != "tuned":
        config = dataclasses.replace(config, fetch_ahead=not config.fetch_ahead)
    out, arrivals = torch.empty_like(q), torch.zeros(rows, heads, dtype=torch.int32, device=DEVICE)
    partial = torch.empty(attention_partials(rows, heads, d, config), device=DEVICE)
    decode_attention(q, k, v, mask, torch.tensor(slot, device=DEVICE), out, partial, arrivals, config=config,
                     first=first)
    live = (mask & (torch.arange(length, device=DEVICE) <= slot))[:, None, None, :]
    expected = torch.nn.functional.scaled_dot_product_attention(q.float().view(rows, heads, 1, d), k.float(), v.float(),
                                                                 attn_mask=live)
    torch.testing.assert_close(out.float(), expected.reshape(rows, heads * d), rtol=2e-3, atol=2e-3)
    assert not arrivals.any()
