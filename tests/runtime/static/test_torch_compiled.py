"""The static-cache backend (torch-compiled) against the Hugging Face reference: logits, greedy
tokens through its fused greedy steps, reused caches, compiled decode steps."""

import torch

from pipeline.accuracy import compare_logits
from pipeline.runtime.batch import left_pad
from pipeline.runtime.dynamic.torch_eager import TorchEagerBackend
from pipeline.runtime.generate import Generator
from pipeline.runtime.sampling import Sampling
from pipeline.runtime.static.torch_compiled import TorchCompiledBackend
from tests.runtime.conftest import PROMPTS


def test_static_cache_backend_matches_the_reference(model):
    """Same logits on a left-padded prefill, same greedy tokens over 20 steps."""
    eager, static = TorchEagerBackend(model), TorchCompiledBackend(model, "fp32", "cpu", compile=False)
    batch = left_pad(PROMPTS, 0, torch.device("cpu"))
    logits = []
    for backend in (eager, static):
        backend.reset(3, 30)
        logits.append(backend.prefill(batch, last_only=False))
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
