"""int8-wo's one set of weights: the quantiser against its rule written plainly, and the folded model
against the model it folds (the graph export writes from it, and read back: tests/export/test_int8.py)."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from pipeline.int8_weights import folded_model, quantize_rows


def test_quantize_rows_is_per_output_symmetric_int8():
    """Against the rule written plainly: each output row's absolute maximum maps to 127, no zero point,
    round half to even; an all-zero row keeps scale 1; the round trip is within half a step."""
    torch.manual_seed(0)
    w = torch.randn(3, 40, 24)
    w[1, 5] = 0.0
    q, scale = quantize_rows(w)
    assert q.dtype == torch.int8 and q.shape == w.shape and scale.shape == (3, 40) and scale.dtype == torch.float32
    for layer in range(3):
        for row in range(40):
            absmax = w[layer, row].abs().max().item()
            expected = absmax / 127 if absmax else 1.0
            assert scale[layer, row].item() == pytest.approx(expected, rel=1e-6)
            assert q[layer, row].tolist() == torch.clamp(torch.round(w[layer, row] / scale[layer, row]), -127, 127).int().tolist()
    assert q.abs().amax(-1)[w.abs().amax(-1) > 0].eq(127).all()
    assert ((q.float() * scale[..., None] - w).abs() <= scale[..., None] / 2 + 1e-6).all()
    assert q[1, 5].eq(0).all() and scale[1, 5] == 1.0


def test_quantize_rows_to_a_narrower_top_saturates_there():
    """The CPU graph's 7-bit weights (export/ort_graph.py, DYNAMIC_INT8_TOP): the maximum maps to 63."""
    torch.manual_seed(1)
    w = torch.randn(10, 16)
    q, scale = quantize_rows(w, top=63)
    assert q.abs().amax(-1).eq(63).all()
    torch.testing.assert_close(scale, w.abs().amax(-1) / 63, rtol=1e-6, atol=0)


def test_quantize_rows_to_fp8_puts_each_rows_maximum_at_448_and_rounds_to_e4m3():
    """fp8 (e4m3) weights: each output row's absolute maximum maps to 448, e4m3's largest value, and
    every weight to the e4m3 value nearest it / scale (torch's cast, round to nearest even)."""
    torch.manual_seed(0)
    w = torch.randn(40, 24)
    q, scale = quantize_rows(w, torch.float8_e4m3fn)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (40,)
    torch.testing.assert_close(scale, w.abs().amax(-1) / 448, rtol=1e-6, atol=0)
    assert q.float().abs().amax(-1).eq(448).all()
    assert torch.equal(q, (w / scale[:, None]).to(torch.float8_e4m3fn))
    assert ((q.float() * scale[:, None] - w).abs() <= w.abs() / 16 + 1e-6).all()  # 3 mantissa bits


def test_the_folded_model_is_the_same_function_with_identity_norms_and_a_head_of_its_own():
    torch.manual_seed(2)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=300)).eval()
    with torch.no_grad():  # a fresh model's layer norms are the identity, which would hide their gamma and beta
        for name, p in model.named_parameters():
            if ".ln_" in name:
                p.add_(0.3 * torch.randn_like(p))
    before = {name: p.clone() for name, p in model.state_dict().items()}
    folded = folded_model(model)
    ids = torch.randint(0, 300, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(folded(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-4)
    norms = [m for m in folded.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert len(norms) == 5 and all(n.weight.eq(1).all() and n.bias.eq(0).all() for n in norms)
    assert folded.lm_head.weight is not folded.transformer.wte.weight and folded.lm_head.bias is not None
    assert all(torch.equal(p, before[name]) for name, p in model.state_dict().items())  # the model itself is untouched
    assert model.lm_head.weight is model.transformer.wte.weight
