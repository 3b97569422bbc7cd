"""The prefill's fused kernels (prefill_kernels.TritonOps), run by Triton's interpreter on the CPU,
against TorchOps."""

import pytest
import torch

pytest.importorskip("triton")

if torch.cuda.is_available():  # conftest chose the interpreter only where there is no GPU
    pytest.skip("these check the kernels in Triton's interpreter, on a CPU-only machine", allow_module_level=True)


@pytest.mark.parametrize("last_only", [False, True])
def test_prefill_ops_match_pytorch(last_only):
    """The prefill's layer norm (with and without biases the stream owes) and its residual product
    in place (with and without its bias), also on the last position of each row, and its one-launch
    cache write give what TorchOps' PyTorch ops give."""
    from pipeline.runtime.kernels.prefill_kernels import TritonOps
    from pipeline.runtime.kernels.torch_ops import TorchOps
    torch.manual_seed(3)
    x, a = torch.randn(2, 5, 48).half() * 4 + 2, torch.randn(2, 5, 32).half()
    weight, bias = torch.rand(48) + 0.5, torch.randn(48)
    w, b, owed = torch.randn(48, 32).half() / 4, torch.randn(48).half(), torch.randn(48) * 3
    if last_only:
        x, a = x[:, -1:], a[:, -1:]
    for debt in (None, owed):
        expected = TorchOps.layer_norm(x.float(), debt, weight, bias, 1e-5)
        torch.testing.assert_close(TritonOps.layer_norm(x, debt, weight.half(), bias.half(), 1e-5).float(), expected,
                                   rtol=2e-3, atol=2e-3)
    for product_bias in (None, b):
        expected = TorchOps.add_linear(x.float(), a.float(), w.float(), None if product_bias is None else b.float())
        stream = x.clone() if not last_only else torch.randn(2, 5, 48).half()[:, -1:].copy_(x)
        got = TritonOps.add_linear(stream, a, w, product_bias)
        assert got.data_ptr() == stream.data_ptr()  # in place
        torch.testing.assert_close(got.float(), expected, rtol=2e-3, atol=2e-3)
    qkv = torch.randn(2, 5, 3 * 32)
    caches = [[torch.zeros(2, 4, 9, 8) for _ in range(2)] for _ in range(2)]
    TorchOps.write_cache(qkv, *caches[0], 3, torch.arange(3, 8))
    TritonOps.write_cache(qkv, *caches[1], 3, torch.arange(3, 8))
    assert caches[0][0][:, :, 3:8].abs().sum() > 0 and all(map(torch.equal, caches[0], caches[1]))


@pytest.mark.parametrize("seq", [5, 64, 70])  # within one block, exactly one, a second block's tail
def test_prefill_causal_attention_and_embedding_match_pytorch(seq):
    """The fused causal attention writes the cache slots 0..seq exactly as TorchOps does (and no
    other) and attends as SDPA's causal kernel; the embedding fused into the first layer norm gives
    TorchOps' gather, add and norm, for positions given per row and shared by every row."""
    from pipeline.runtime.kernels.prefill_kernels import TritonOps
    from pipeline.runtime.kernels.torch_ops import TorchOps
    torch.manual_seed(4)
    qkv = torch.randn(2, seq, 3 * 32)
    caches = [[torch.full((2, 2, seq + 9, 16), 7.0) for _ in range(2)] for _ in range(2)]
    expected = TorchOps.causal_attention(qkv, *caches[0])
    got = TritonOps.causal_attention(qkv, *caches[1])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert all(map(torch.equal, caches[0], caches[1])) and (caches[1][0][:, :, seq:] == 7).all()
    wte, wpe = torch.randn(50, 48).half() * 3, torch.randn(80, 48).half()
    weight, bias = torch.rand(48) + 0.5, torch.randn(48)
    ids = torch.randint(0, 50, (2, seq))
    for positions in (torch.arange(seq).expand(2, seq), torch.randint(0, 80, (2, seq))):
        want = TorchOps.embed_layer_norm(wte.float(), wpe.float(), ids, positions, weight, bias, 1e-5)
        fused = TritonOps.embed_layer_norm(wte, wpe, ids, positions, weight.half(), bias.half(), 1e-5)
        for g, w in zip(fused, want):
            torch.testing.assert_close(g.float(), w, rtol=2e-3, atol=2e-3)
