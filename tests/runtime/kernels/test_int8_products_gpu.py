"""The prefill's int8-weight products compiled for the GPU, against PyTorch's fp16 product on the
dequantised weights, at the prefill's shapes (a 128-token prompt of 1 and of 64 rows, the last positions)."""

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU: the interpreter's run is test_int8_products", allow_module_level=True)

from pipeline.int8_weights import quantize_rows  # noqa: E402
from pipeline.runtime.kernels.int8_products import Int8WeightOps, RowScaled  # noqa: E402


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [128, 64 * 128, 64])
@pytest.mark.parametrize("k,n", [(768, 2304), (3072, 768), (768, 50304)])
def test_the_products_match_fp16_on_the_dequantised_weights(rows, k, n):
    torch.manual_seed(0)
    q, scale = quantize_rows(torch.randn(n, k, device="cuda") / k**0.5)
    w, dense = RowScaled(q, scale.float()), (q.float() * scale.float()[:, None]).half()
    a, bias = torch.randn(rows, k, device="cuda").half(), torch.randn(n, device="cuda").half()
    torch.testing.assert_close(Int8WeightOps.linear(a, w, bias), F.linear(a, dense, bias), rtol=2e-2, atol=2e-2)
    x = torch.randn(rows, n, device="cuda").half()
    want = x.float() + F.linear(a, dense).float()
    torch.testing.assert_close(Int8WeightOps.add_linear(x, a, w, None).float(), want, rtol=2e-2, atol=2e-2)
