"""The static-cache backends' CUDA graphs (prefill, decode, greedy), which are captured only on a GPU:
the same logits and tokens as the same backend without a graph."""

import copy

import numpy as np
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from pipeline.accuracy import compare_logits
from pipeline.runtime.batch import left_pad
from pipeline.runtime.generate import Generator
from pipeline.runtime.sampling import Sampling
from pipeline.runtime.static.torch_compiled import TorchCompiledBackend

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU: the static-cache backends capture CUDA graphs only there", allow_module_level=True)
from pipeline.runtime.static.triton_backend import TritonBackend  # noqa: E402

DEVICE = torch.device("cuda")
PADDED = [list(range(100, 100 + n)) for n in (5, 9, 3, 9)]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=128, n_positions=256)).eval()


BACKENDS = {"triton": TritonBackend, "torch-compiled": TorchCompiledBackend}


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("prompts", [np.random.default_rng(1).integers(0, 50000, size=(8, 16)), PADDED],
                         ids=["unpadded", "padded"])
def test_prefill_graph_takes_its_ids_from_the_host(model, name, prompts):
    """The prefill graph copies its ids in from page-locked memory as its first node: replays of new
    batches of the same shape give the logits of the prefill run without a graph."""

    backend = BACKENDS[name](model, "fp16", DEVICE)
    batch = left_pad(prompts, 0, DEVICE)
    rows, width = batch.host_ids.shape
    backend.reset(rows, width + 8)
    reference = backend.prefill(batch, last_only=False)[:, -1:].clone()
    replays = []
    for _ in range(4):
        backend.reset(rows, width + 8)
        replays.append(backend.prefill(left_pad(prompts, 0, DEVICE)).clone())
    assert all(torch.equal(r, replays[0]) for r in replays)
    # last_only runs the last layer for the last position alone: its products may round differently
    assert compare_logits(replays[0], reference)["rel_error"] < 1e-3


@pytest.mark.parametrize("name", BACKENDS)
def test_the_prefill_graph_keeps_the_buffer_it_copies_the_batch_into(model, name):
    """A buffer the graph writes into but does not own, once freed, goes to the next tensors of its size,
    which every replay then overwrites (or, handed back to the driver by empty_cache, faults on)."""
    backend = BACKENDS[name](model, "fp16", DEVICE)
    batch = left_pad(PADDED, 0, DEVICE)
    rows, width = batch.host_ids.shape
    backend.reset(rows, width + 8)
    backend.prefill(batch)  # captured
    bystanders = [torch.full(batch.host.shape, -1, dtype=torch.long, device=DEVICE) for _ in range(8)]
    backend.reset(rows, width + 8)
    backend.prefill(left_pad(PADDED, 0, DEVICE))
    torch.cuda.synchronize()
    assert all(bool((b == -1).all()) for b in bystanders)


@pytest.mark.parametrize("name", BACKENDS)
def test_a_cache_reused_after_an_unpadded_generation_gives_a_fresh_caches_tokens(model, name):
    """The unpadded generation marks every slot real after its prefill; the padded prompts after it
    must not attend to their padding."""
    s = Sampling(max_new_tokens=24)
    fresh = Generator(BACKENDS[name](model, "fp16", DEVICE)).generate(PADDED, s)
    reused = BACKENDS[name](model, "fp16", DEVICE)
    Generator(reused).generate(np.full((4, 9), 7), Sampling(max_new_tokens=40))
    assert Generator(reused).generate(PADDED, s) == fresh


def test_streams_started_without_waiting_each_prefill_their_own_prompts(model):
    """Each new stream refills the prefill graph's page-locked ids while the last prefill may still
    be running on the device: the refill waits for it, so every first token follows its prompts."""
    backend = TritonBackend(model, "fp16", DEVICE)
    prompts = np.random.default_rng(2).integers(0, 50000, size=(64, 128))
    s = Sampling(max_new_tokens=8)
    firsts = [next(iter(Generator(backend).stream(prompts if k % 2 == 0 else prompts[::-1], s))).clone()
              for k in range(6)]
    assert not torch.equal(firsts[0], firsts[1])
    assert all(torch.equal(firsts[k], firsts[k % 2]) for k in range(6))


@pytest.fixture(scope="module")
def spread_model(model):
    """The model with logits spread about as a trained GPT-2's (a standard deviation near 3, where a
    random model's is 0.2): over near-equal logits a draw turns on the last bit of a split-K sum,
    which lands in any order, so the same steps drew differently run to run, graphed or not
    (docs/journal/performance.md)."""
    spread = copy.deepcopy(model)
    with torch.no_grad():
        spread.transformer.ln_f.weight.mul_(15.0)
    return spread


@pytest.mark.parametrize("name", BACKENDS)
def test_sampled_steps_replayed_from_a_graph_draw_what_they_draw_without_one(spread_model, name):
    """The sampled step's graph (the decode step, the sampler, the inputs advanced) against the same
    backend stepping without graphs: the same seeded, penalised tokens, twice in a row (the graph
    captured, then replayed on a table filled anew). In fp32: fp16 activations can round the split-K
    sums' differences up to where a draw lands elsewhere."""
    model = spread_model
    s = Sampling(max_new_tokens=24, do_sample=True, temperature=0.9, top_p=0.9, top_k=40, repetition_penalty=1.2,
                 frequency_penalty=0.3, seed=17)
    plain = Generator(BACKENDS[name](model, "fp32", DEVICE, cuda_graphs=False)).generate(PADDED, s)
    graphed = BACKENDS[name](model, "fp32", DEVICE)
    assert Generator(graphed).generate(PADDED, s) == plain
    assert Generator(graphed).generate(PADDED, s) == plain
