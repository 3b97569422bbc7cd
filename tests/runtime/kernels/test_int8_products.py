"""The prefill's products on int8 weights (int8_products), run by Triton's interpreter on the CPU,
against PyTorch's product on the dequantised weights."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

if torch.cuda.is_available():  # conftest chose the interpreter only where there is no GPU
    pytest.skip("these check the kernels in Triton's interpreter, on a CPU-only machine", allow_module_level=True)

from pipeline.int8_weights import quantize_rows  # noqa: E402
from pipeline.runtime.kernels.int8_products import Int8WeightOps, RowScaled, int8_weight_product  # noqa: E402
from pipeline.runtime.kernels.torch_ops import TorchOps  # noqa: E402


def weights(n: int, k: int) -> tuple[RowScaled, torch.Tensor]:
    """int8 weights of a random [n, k] matrix, and the float matrix they stand for."""
    q, scale = quantize_rows(torch.randn(n, k) / k**0.5)
    return RowScaled(q, scale.float()), q.float() * scale.float()[:, None]


# rows past one 128-row tile and under one 64-row tile; widths no tile divides
@pytest.mark.parametrize("rows,k,n", [(300, 100, 200), (3, 64, 130), (1, 37, 5)])
def test_the_product_is_pytorchs_on_the_dequantised_weights(rows, k, n):
    torch.manual_seed(rows)
    w, dense = weights(n, k)
    a, bias = torch.randn(2, rows, k), torch.randn(n)
    torch.testing.assert_close(int8_weight_product(a, w), F.linear(a, dense), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(Int8WeightOps.linear(a, w, bias), F.linear(a, dense, bias), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(Int8WeightOps.linear_gelu(a, w, bias), TorchOps.linear_gelu(a, dense, bias),
                               rtol=1e-5, atol=1e-5)


def test_the_residual_product_adds_into_the_stream_in_place_also_at_each_rows_last_position():
    torch.manual_seed(1)
    w, dense = weights(48, 32)
    a, bias = torch.randn(2, 5, 32), torch.randn(48)
    for last_only in (False, True):
        stream = torch.randn(2, 5, 48)
        x, inputs = (stream[:, -1:], a[:, -1:]) if last_only else (stream, a)
        expected = TorchOps.add_linear(x.clone(), inputs, dense, bias)
        before = stream.clone()
        got = Int8WeightOps.add_linear(x, inputs, w, bias)
        assert got.data_ptr() == x.data_ptr()  # in place
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        if last_only:  # the other positions are left as they were
            assert torch.equal(stream[:, :-1], before[:, :-1])


def test_fp16_activations_round_as_a_float_product_does():
    torch.manual_seed(2)
    w, dense = weights(96, 64)
    a = torch.randn(4, 64).half()
    torch.testing.assert_close(int8_weight_product(a, w).float(), F.linear(a.float(), dense), rtol=2e-3, atol=2e-3)


def test_a_layer_of_stacked_weights_is_indexed_as_a_float_tensors():
    q, scale = torch.randint(-127, 128, (3, 8, 4), dtype=torch.int8), torch.rand(3, 8)
    layer = RowScaled(q, scale)[1]
    assert torch.equal(layer.q, q[1]) and torch.equal(layer.scale, scale[1]) and layer.shape == (8, 4)
