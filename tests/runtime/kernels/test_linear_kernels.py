"""fused_linear and layer_norm (linear_kernels), run by Triton's interpreter on the CPU against
PyTorch: one-byte weights, split K, the folded layer norm, GELU, and the arguments they refuse."""

import pytest
import torch

pytest.importorskip("triton")

if torch.cuda.is_available():  # conftest chose the interpreter only where there is no GPU
    pytest.skip("these check the kernels in Triton's interpreter, on a CPU-only machine", allow_module_level=True)
from pipeline.int8_weights import quantize_rows  # noqa: E402
from pipeline.runtime.kernels.linear_kernels import fused_linear  # noqa: E402
from pipeline.runtime.kernels.tiles import LinearConfig  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn], ids=["int8", "fp8"])
# one row: row products; three: tiles, the weights either operand
@pytest.mark.parametrize("rows, weights_left", [(1, False), (3, False), (3, True)], ids=["row", "right", "left"])
@pytest.mark.parametrize("ln, residual, split_k", [(False, False, 1), (True, False, 1), (False, True, 2)])
def test_one_byte_weights_read_in_the_kernel_equal_dequantise_then_matmul(rows, ln, residual, split_k, dtype,
                                                                          weights_left):
    """fused_linear over int8 or fp8 weights and their scales (row products at one row, tiles at three,
    with the folded layer norm, and split K into a residual; the tiles with the weights as either
    operand) against the same product in fp32 over the dequantised weights (within fp16's rounding:
    the tiles take x, or its layer norm, in fp16, the activations' type in int8-wo)."""
    torch.manual_seed(2)
    x, w = (torch.randn(rows, 64) * 2 + 0.5).half().float(), torch.randn(48, 64)
    q, scale = quantize_rows(w, dtype)
    real = q.float() * scale[:, None]
    bias = torch.randn(48)
    out = torch.randn(rows, 48) if residual else torch.empty(rows, 48)
    expected = (torch.nn.functional.layer_norm(x, (64,), eps=1e-5) if ln else x) @ real.t() + bias
    if residual:
        expected += out
    block_m = 1 if rows == 1 else 16
    fused_linear(x, q, out, bias, ln=(real.sum(1), 1e-5) if ln else None, residual=residual, scale=scale,
                 config=LinearConfig(block_m, 16, 16 if block_m > 1 else 0, split_k, weights_left=weights_left))
    torch.testing.assert_close(out, expected, rtol=2e-3, atol=1e-2)
    with pytest.raises(ValueError, match="fp8 weights take their scale"):
        fused_linear(x, q, torch.empty(rows, 48))


@pytest.mark.parametrize("block_m", [1, 16])  # row products (K slices of 96, 48 and 32: masked past 48), tiles
@pytest.mark.parametrize("split_k", [1, 2, 3])
def test_split_k_adds_each_slice_and_the_bias_once(split_k, block_m):
    from pipeline.runtime.kernels.linear_kernels import fused_linear
    from pipeline.runtime.kernels.tiles import LinearConfig
    torch.manual_seed(1)
    x, w, bias = torch.randn(3, 96), torch.randn(48, 96), torch.randn(48)
    residual = torch.randn(3, 48)
    out = residual.clone()
    fused_linear(x, w, out, bias, residual=True, config=LinearConfig(block_m, 16, 16, split_k))
    torch.testing.assert_close(out, residual + x @ w.T + bias, rtol=1e-5, atol=1e-4)


# row products; tiles walking K in three 32-wide chunks, the weights as either operand
@pytest.mark.parametrize("block_m, weights_left", [(1, False), (16, False), (16, True)])
def test_layer_norm_and_gelu_over_several_k_chunks(block_m, weights_left):
    """The norm's weight and bias folded into the product, as StaticGPT2 folds them."""
    from pipeline.runtime.kernels.linear_kernels import fused_linear
    from pipeline.runtime.kernels.tiles import LinearConfig
    torch.manual_seed(3)
    x, w, bias = 3.0 + 2.0 * torch.randn(5, 96), torch.randn(40, 96) / 10, torch.randn(40)
    gamma, beta = 1.0 + torch.randn(96) / 5, torch.randn(96) / 5
    folded_w, folded_bias = w * gamma, bias + w @ beta
    out = torch.empty(5, 40)
    fused_linear(x, folded_w, out, folded_bias, ln=(folded_w.sum(1), 1e-5), gelu=True,
                 config=LinearConfig(block_m, 16, 32, weights_left=weights_left))
    normed = torch.nn.functional.layer_norm(x, (96,), gamma, beta, 1e-5)
    expected = torch.nn.functional.gelu(normed @ w.T + bias, approximate="tanh")
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_layer_norm_keeps_fp16_precision_for_rows_far_off_centre():
    """A row far off centre or with an outlier keeps fp16 precision: the tiles cast x minus a
    reference near its mean for the product, the row products centre x before its variance."""
    from pipeline.runtime.kernels.linear_kernels import fused_linear
    from pipeline.runtime.kernels.tiles import LinearConfig
    torch.manual_seed(4)
    x, w = 0.5 * torch.randn(4, 128), (torch.randn(64, 128) / 10).half()
    x[0] += 300.0
    x[3, 100] = 60.0
    reference = torch.nn.functional.layer_norm(x.double(), (128,), eps=1e-5) @ w.double().T
    for block_m in (1, 16):
        out = torch.empty(4, 64)
        fused_linear(x, w, out, ln=(w.float().sum(1), 1e-5), config=LinearConfig(block_m, 16, 64))
        assert ((out.double() - reference).norm(dim=1) / reference.norm(dim=1)).max() < 1e-3


def test_layer_norm_launch_matches_pytorch_in_the_output_dtype():
    from pipeline.runtime.kernels.linear_kernels import layer_norm
    torch.manual_seed(5)
    x = 0.5 * torch.randn(5, 48)  # 48: masked past it in a 64-wide block
    x[0] += 300.0
    out = torch.empty(5, 48, dtype=torch.float16)
    layer_norm(x, out, 1e-5)
    reference = torch.nn.functional.layer_norm(x.double(), (48,), eps=1e-5)
    assert ((out.double() - reference).abs().max() / reference.abs().max()) < 1e-3


def test_a_layer_norm_needs_one_weight_sum_per_row_of_w():
    from pipeline.runtime.kernels.linear_kernels import fused_linear
    with pytest.raises(ValueError, match="w_sums is \\(64,\\): it must be w.float\\(\\).sum\\(1\\)"):
        fused_linear(torch.randn(1, 64), torch.randn(16, 64), torch.empty(1, 16), ln=(torch.ones(64), 1e-5))


def test_split_k_needs_a_residual_fp32_output():
    from pipeline.runtime.kernels.linear_kernels import fused_linear
    from pipeline.runtime.kernels.tiles import LinearConfig
    with pytest.raises(ValueError, match="split_k=2 needs a residual fp32 output"):
        fused_linear(torch.randn(1, 64), torch.randn(16, 64), torch.empty(1, 16), config=LinearConfig(16, 16, 32, 2))
