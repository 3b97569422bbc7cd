"""StaticGPT2's prefill and decode step against the Hugging Face model it was built from."""

import copy

import pytest
import torch

from pipeline.accuracy import compare_logits
from pipeline.runtime.batch import left_pad
from pipeline.runtime.dynamic.torch_eager import TorchEagerBackend
from pipeline.runtime.generate import Generator
from pipeline.runtime.sampling import (
    Sampling,
)
from pipeline.runtime.static.static_gpt2 import StaticGPT2
from pipeline.runtime.static.torch_compiled import TorchCompiledBackend
from tests.runtime.conftest import PROMPTS


def test_a_prompt_without_padding_takes_causal_attention_with_the_same_logits(model):
    net = StaticGPT2(model, torch.float32)
    batch = left_pad([p[:2] for p in PROMPTS], 0, torch.device("cpu"))  # equal lengths: no padding
    caches = [net.new_cache(3, 4) for _ in range(3)]
    masked, causal = (net.prefill(batch.input_ids, batch.position_ids, batch.attention_mask.bool(), cache, causal=c)
                      for c, cache in zip((False, True), caches))
    assert compare_logits(causal, masked)["rel_error"] < 1e-6
    # last_only: the last layer runs attention, projection and MLP for the last position alone
    last = net.prefill(batch.input_ids, batch.position_ids, batch.attention_mask.bool(), caches[2], last_only=True,
                       causal=True)
    assert last.shape == (3, 1, model.config.vocab_size) and compare_logits(last, masked[:, -1:])["rel_error"] < 1e-6
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(caches[2], caches[0]))  # every position's keys and values
    with pytest.raises(ValueError, match="causal needs a prefill from slot 0"):
        net.prefill(batch.input_ids, batch.position_ids, batch.attention_mask.bool(), net.new_cache(3, 4), 1, causal=True)
    eager, static = TorchEagerBackend(model), TorchCompiledBackend(model, "fp32", "cpu", compile=False)
    s = Sampling(max_new_tokens=6)
    prompts = [p[:2] for p in PROMPTS]
    assert Generator(static).generate(prompts, s) == Generator(eager).generate(prompts, s)
    static.reset(3, 4)  # the backend takes the unpadded batch's causal path
    assert compare_logits(static.prefill(batch), masked[:, -1:])["rel_error"] < 1e-6


def test_folded_layer_norms_compute_the_same_function(model):
    """StaticGPT2(fold_layer_norms=True) moves each norm's weight and bias into the product after it
    (the LM head gets its own copy of the tied embedding); the logits stay those of the model."""
    perturbed = copy.deepcopy(model)
    with torch.no_grad():  # a fresh model's norms are the identity, which any fold would pass
        for name, p in perturbed.named_parameters():
            if ".ln_" in name:
                p.add_(0.2 * torch.randn_like(p))
    batch = left_pad(PROMPTS, 0, torch.device("cpu"))
    plain, folded = (StaticGPT2(perturbed, torch.float32, fold) for fold in (False, True))
    logits = [net.prefill(batch.input_ids, batch.position_ids, batch.attention_mask.bool(), net.new_cache(3, 6))
              for net in (plain, folded)]
    assert compare_logits(logits[1], logits[0], batch.attention_mask)["rel_error"] < 1e-5
    assert folded.head_w is not folded.wte and plain.head_w is plain.wte
    assert not torch.allclose(folded.qkv_w, plain.qkv_w) and torch.equal(folded.ln1_w, torch.ones_like(plain.ln1_w))
