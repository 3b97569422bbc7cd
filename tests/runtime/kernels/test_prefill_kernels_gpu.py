"""The triton backend's prefill kernels compiled for a GPU, in fp16 on tensor cores, against
PyTorch's ops (the CPU tests run the same kernels in Triton's interpreter, in fp32)."""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU: on a CPU tests/runtime/static/test_triton_backend.py runs these kernels interpreted",
                allow_module_level=True)
from pipeline.runtime.kernels.prefill_kernels import TritonOps  # noqa: E402
from pipeline.runtime.kernels.torch_ops import TorchOps  # noqa: E402

DEVICE = torch.device("cuda")


@pytest.mark.parametrize("seq", [128, 200])  # whole blocks; a last block's tail
def test_causal_attention_writes_the_cache_and_attends_as_sdpa(seq):
    torch.manual_seed(0)
    qkv = torch.randn(4, seq, 3 * 768, dtype=torch.half, device=DEVICE)
    caches = [[torch.full((4, 12, 256, 64), 7.0, dtype=torch.half, device=DEVICE) for _ in range(2)] for _ in range(2)]
    expected = TorchOps.causal_attention(qkv, *caches[0])
    got = TritonOps.causal_attention(qkv, *caches[1])
    assert all(map(torch.equal, caches[0], caches[1]))
    torch.testing.assert_close(got, expected, rtol=2e-3, atol=2e-3)


def test_embedding_fused_into_the_first_layer_norm():
    torch.manual_seed(0)
    wte, wpe = (torch.randn(n, 768, dtype=torch.half, device=DEVICE) for n in (50304, 1024))
    weight, bias = torch.rand(768, device=DEVICE).half() + 0.5, torch.randn(768, device=DEVICE).half()
    ids = torch.randint(0, 50257, (8, 128), device=DEVICE)
    for positions in (torch.arange(128, device=DEVICE).expand(8, 128), torch.randint(0, 1024, (8, 128), device=DEVICE)):
        expected = TorchOps.embed_layer_norm(wte, wpe, ids, positions, weight, bias, 1e-5)
        got = TritonOps.embed_layer_norm(wte, wpe, ids, positions, weight, bias, 1e-5)
        torch.testing.assert_close(got[0], expected[0], rtol=0, atol=0)  # the sum rounds as PyTorch's add
        torch.testing.assert_close(got[1], expected[1], rtol=2e-3, atol=2e-3)
