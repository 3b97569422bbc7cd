"""A decode step's cost figures: the bytes it must read, counted from a real model's tensors."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from pipeline.machine import shape_description
from pipeline.step_cost import WEIGHT_BYTES, copy_bandwidth, device_ops_per_step, step_cost, step_read_bytes

CPU, GPU = torch.device("cpu"), torch.device("cuda")


def model_and_shape():
    config = GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=128, vocab_size=500)
    model = GPT2LMHeadModel(config)
    return model, shape_description(config.n_layer, config.n_head, config.n_embd, config.vocab_size, config.n_positions)


@pytest.mark.parametrize("precision", list(WEIGHT_BYTES))
def test_a_step_reads_every_weight_once_but_the_position_table(precision):
    """The tied LM head is the token table, read once; of the position table a step reads one row."""
    model, shape = model_and_shape()
    weights = sum(p.numel() for name, p in model.named_parameters() if "wpe" not in name)
    assert step_read_bytes(shape, precision, CPU, rows=1, context=0) == weights * WEIGHT_BYTES[precision]


def test_each_row_reads_its_keys_and_values_of_every_layer_at_the_caches_width():
    model, shape = model_and_shape()
    one_row = 2 * 2 * 100 * 64  # keys and values, 2 layers, 100 positions, 64 wide
    for device, precision, width in [(CPU, "fp16", 4), (GPU, "fp16", 2), (GPU, "int8-wo", 2), (GPU, "fp32", 4)]:
        grows = step_read_bytes(shape, precision, device, 3, 100) - step_read_bytes(shape, precision, device, 1, 100)
        assert grows == 2 * one_row * width


def test_the_floor_is_the_read_at_the_copy_bandwidth():
    cost = step_cost(row_decode_ms=2.0, read_bytes=1e9, bandwidth=1e12)
    assert cost == {"step_read_mb": 1000.0, "read_gbps": 500.0, "floor_ms": 1.0, "of_floor": 0.5}


def test_a_cpu_copy_is_timed_and_launches_nothing():
    assert 1e8 < copy_bandwidth(CPU, repeats=2) < 1e13  # bytes a second: between 0.1 and 10,000 GB/s
    assert device_ops_per_step(None, None, None, CPU) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: launches are counted on one")
def test_launches_inside_cuda_graphs_are_counted_as_those_without_a_graph():
    """The triton engine's step replayed from a CUDA graph counts as many device operations as the same
    step launched one by one (the profiler sees inside graphs), and the count does not drift."""
    from pipeline.runtime.sampling import Sampling
    from pipeline.runtime.static.triton_backend import TritonBackend

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=128, n_positions=256))  # test_cuda_graphs' shape
    prompts = [list(range(10, 26))] * 2
    greedy = Sampling(max_new_tokens=8)
    graphed = TritonBackend(model.eval(), "fp16", GPU)
    counted = device_ops_per_step(graphed, prompts, greedy, GPU)
    plain = device_ops_per_step(TritonBackend(model.eval(), "fp16", GPU, cuda_graphs=False), prompts, greedy, GPU)
    assert counted == device_ops_per_step(graphed, prompts, greedy, GPU)
    assert 2 * 2 <= counted and plain * 0.8 <= counted <= plain * 1.2  # at least a few kernels per layer
