"""The generation runtime: sampling, the generator's padding/stop/limit rules, and the static-cache
PyTorch backend against the Hugging Face reference."""

import copy

import numpy as np
import pytest
import torch

from pipeline.errors import UserError
from pipeline.model import new_model
from pipeline.config import load_config
from pipeline.runtime.generate import Generator, left_pad
from pipeline.runtime.kv_buffers import PingPongKV
from pipeline.runtime.sampling import Sampling, apply_repetition_penalty, filter_top_k_top_p, next_tokens
from pipeline.runtime.static_gpt2 import StaticGPT2
from pipeline.runtime.torch_compiled import TorchCompiledBackend
from pipeline.runtime.torch_eager import TorchEagerBackend
from pipeline.metrics import compare_logits


@pytest.fixture(scope="module")
def model():
    cfg = load_config("tiny", overrides=["model.n_layer=2", "model.n_embd=64", "model.n_head=4", "model.n_positions=64",
                                         "data.block_size=32", "data.calib_block_size=32", "engine.max_len=64",
                                         "engine.opt_len=32", "engine.max_seq=32", "validate.prompt_tokens=16"])
    return new_model(cfg.model, seed=0).eval()


PROMPTS = [[464, 2068, 7586, 21831, 18045, 625], [15496, 995], [818, 262, 3726]]


def test_top_k_and_top_p_keep_the_right_tokens():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0]])
    assert torch.isinf(filter_top_k_top_p(logits, 2, 1.0)).tolist() == [[False, False, True, True]]
    # probabilities ~ [0.64, 0.24, 0.09, 0.03]: top_p 0.7 keeps the two that first reach 0.7
    assert torch.isinf(filter_top_k_top_p(logits, 0, 0.7)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_top_k_top_p(logits, 0, 0.5)).tolist() == [[False, True, True, True]]


def test_repetition_penalty_follows_ctrl():
    out = apply_repetition_penalty(torch.tensor([[2.0, -2.0, 1.0]]), torch.tensor([[0, 1]]), 2.0)
    assert out.tolist() == [[1.0, -4.0, 1.0]]


def test_seeded_sampling_is_reproducible():
    logits = torch.randn(4, 100)
    s = Sampling(do_sample=True, temperature=0.9, top_k=20, top_p=0.9, seed=7)
    draws = [next_tokens(logits, torch.zeros(4, 1, dtype=torch.long), s, torch.Generator().manual_seed(7)) for _ in range(2)]
    assert torch.equal(*draws)


@pytest.mark.parametrize("settings, message", [
    (dict(do_sample=True, temperature=0.0), "--temperature 0.0: must be > 0"),
    (dict(top_p=0.0), "--top-p 0.0: must be in"),
    (dict(top_p=1.5), "--top-p 1.5"),
    (dict(max_new_tokens=0), "--max-new-tokens 0"),
])
def test_bad_sampling_settings(model, settings, message):
    with pytest.raises(UserError, match=message):
        next(Generator(TorchEagerBackend(model)).stream(PROMPTS, Sampling(**settings)))


def test_empty_prompt_and_context_limit(model):
    gen = Generator(TorchEagerBackend(model))
    with pytest.raises(UserError, match="prompt 1 is empty"):
        gen.generate([[1, 2], []], Sampling())
    with pytest.raises(UserError, match="a prompt of 60 tokens plus max_new_tokens=10 exceeds the model's context of 64"):
        gen.generate([[1] * 60], Sampling(max_new_tokens=10))


def test_left_pad_positions_count_real_tokens_only():
    batch = left_pad([[5, 6, 7], [8]], 0, torch.device("cpu"))
    assert batch.input_ids.tolist() == batch.host_ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert batch.attention_mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert batch.position_ids.tolist() == [[0, 1, 2], [0, 0, 0]]
    assert batch.padded and not left_pad([[5, 6], [7, 8]], 0, torch.device("cpu")).padded


def test_prompts_in_one_array_are_taken_as_the_same_lists(model):
    rows = np.array([[5, 6, 7], [8, 9, 10]], dtype=np.int32)
    got, want = left_pad(rows, 0, torch.device("cpu")), left_pad(rows.tolist(), 0, torch.device("cpu"))
    for name in ("input_ids", "attention_mask", "position_ids"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert got.padded is want.padded is False
    same_dtype = rows.astype(np.int64)
    batch = left_pad(same_dtype, 0, torch.device("cpu"))
    same_dtype[0, 0] = 99  # the caller's array is theirs: the batch holds a copy
    assert batch.host_ids[0, 0].item() == batch.input_ids[0, 0].item() == 5
    gen = Generator(TorchEagerBackend(model))
    assert gen.generate(np.array(PROMPTS[2:] * 2), Sampling(max_new_tokens=4)) == gen.generate(PROMPTS[2:] * 2, Sampling(max_new_tokens=4))
    for bad in (np.zeros((2, 0), dtype=np.int64), np.zeros(3, dtype=np.int64), np.zeros((1, 2))):
        with pytest.raises(UserError, match="prompts as an array must be integer token ids"):
            left_pad(bad, 0, torch.device("cpu"))


def test_stop_tokens_end_rows_and_streaming_yields_each_step(model):
    gen = Generator(TorchEagerBackend(model))
    free = gen.generate(PROMPTS, Sampling(max_new_tokens=8))
    stop = free[0][2]
    stopped = gen.generate(PROMPTS, Sampling(max_new_tokens=8, stop_tokens=(stop,)))
    assert stopped[0] == free[0][:free[0].index(stop) + 1]
    steps = list(gen.stream(PROMPTS, Sampling(max_new_tokens=5)))
    assert len(steps) == 5 and all(s.shape == (3,) for s in steps)


def test_static_cache_backend_matches_the_reference(model):
    """Same logits on a left-padded prefill, same greedy tokens over 20 steps."""
    eager, static = TorchEagerBackend(model), TorchCompiledBackend(model, "fp32", "cpu", compile=False)
    batch = left_pad(PROMPTS, 0, torch.device("cpu"))
    logits = []
    for backend in (eager, static):
        backend.reset(3, 30)
        logits.append(backend.forward(batch.input_ids, batch.attention_mask, batch.position_ids))
    assert compare_logits(logits[1], logits[0], batch.attention_mask)["rel_error"] < 1e-5
    s = Sampling(max_new_tokens=20)
    free = Generator(eager).generate(PROMPTS, s)
    assert Generator(static).generate(PROMPTS, s) == free  # through its greedy_steps: argmax fed back in place
    stopped = Sampling(max_new_tokens=20, stop_tokens=(free[1][3],))
    assert Generator(static).generate(PROMPTS, stopped) == Generator(eager).generate(PROMPTS, stopped)


def test_a_reused_cache_ignores_the_last_generations_slot_marks(model):
    """A reset clears no slot marks: after an unpadded generation marks every slot real (its causal
    prefill marks them after it runs), padded prompts on the same cache still match eager."""
    static = TorchCompiledBackend(model, "fp32", "cpu", compile=False)
    s = Sampling(max_new_tokens=12)
    width = max(map(len, PROMPTS))
    Generator(static).generate([PROMPTS[0][:1] * width] * 3, Sampling(max_new_tokens=20))
    assert static.slot.slot_mask[:, :width + 19].all()
    assert Generator(static).generate(PROMPTS, s) == Generator(TorchEagerBackend(model)).generate(PROMPTS, s)


def test_a_prompt_without_padding_takes_causal_attention_with_the_same_logits(model):
    net = StaticGPT2(model, torch.float32)
    batch = left_pad([p[:2] for p in PROMPTS], 0, torch.device("cpu"))  # equal lengths: no padding
    caches = [net.new_cache(3, 4) for _ in range(3)]
    masked, causal = (net(batch.input_ids, batch.position_ids, batch.attention_mask.bool(), 0, cache, causal=c)
                      for c, cache in zip((False, True), caches))
    assert compare_logits(causal, masked)["rel_error"] < 1e-6
    # last_only: the last layer runs attention, projection and MLP for the last position alone
    last = net(batch.input_ids, batch.position_ids, batch.attention_mask.bool(), 0, caches[2], last_only=True,
               causal=True)
    assert last.shape == (3, 1, model.config.vocab_size) and compare_logits(last, masked[:, -1:])["rel_error"] < 1e-6
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(caches[2], caches[0]))  # every position's keys and values
    with pytest.raises(ValueError, match="causal needs a prefill from slot 0"):
        net(batch.input_ids, batch.position_ids, batch.attention_mask.bool(), 1, net.new_cache(3, 4), causal=True)
    eager, static = TorchEagerBackend(model), TorchCompiledBackend(model, "fp32", "cpu", compile=False)
    s = Sampling(max_new_tokens=6)
    prompts = [p[:2] for p in PROMPTS]
    assert Generator(static).generate(prompts, s) == Generator(eager).generate(prompts, s)
    # the caller's word on padding (Generator's) and the backend's own look at the mask agree
    for padded in (None, False):
        static.reset(3, 4)
        logits = static.forward(batch.input_ids, batch.attention_mask, batch.position_ids, last_only=True, padded=padded)
        assert compare_logits(logits, masked[:, -1:])["rel_error"] < 1e-6


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
    logits = [net(batch.input_ids, batch.position_ids, batch.attention_mask.bool(), 0, net.new_cache(3, 6))
              for net in (plain, folded)]
    assert compare_logits(logits[1], logits[0], batch.attention_mask)["rel_error"] < 1e-5
    assert folded.head_w is not folded.wte and plain.head_w is plain.wte
    assert not torch.allclose(folded.qkv_w, plain.qkv_w) and torch.equal(folded.ln1_w, torch.ones_like(plain.ln1_w))


@pytest.mark.parametrize("make", [TorchEagerBackend, lambda m: TorchCompiledBackend(m, "fp32", "cpu", compile=False)],
                         ids=["torch", "torch-compiled"])
def test_last_only_is_the_last_position(model, make):
    backend = make(model)
    batch = left_pad(PROMPTS, 0, torch.device("cpu"))
    outs = []
    for last_only in (False, True):
        backend.reset(3, 30)
        outs.append(backend.forward(batch.input_ids, batch.attention_mask, batch.position_ids, last_only=last_only))
    assert outs[1].shape == (3, 1, model.config.vocab_size)
    assert torch.allclose(outs[1][:, 0], outs[0][:, -1], atol=1e-5)


def test_similar_lengths_share_one_static_cache(model):
    """Cache lengths are rounded up, so requests of similar length reuse one cache (and its graphs)."""
    backend = TorchCompiledBackend(model, "fp32", "cpu", compile=False)
    backend.reset(3, 10)
    first = backend.slot
    backend.reset(3, 40)
    assert backend.slot is first and first.cache[0].shape[2] == model.config.n_positions
    backend.reset(2, 40)
    assert backend.slot is not first


def test_compiled_decode_step_matches(model):
    """torch.compile'd decode step (Inductor's CPU code here; plus a CUDA graph on a GPU)."""
    s = Sampling(max_new_tokens=6)
    compiled = TorchCompiledBackend(model, "fp32", "cpu", compile=True)
    assert Generator(compiled).generate(PROMPTS, s) == Generator(TorchEagerBackend(model)).generate(PROMPTS, s)


def test_ping_pong_buffers_swap_and_bound():
    kv = PingPongKV(2, 3, 4, torch.float32, torch.device("cpu"))
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
