"""What reports name: the model's shape and preset, and the processor with its vector extensions."""

import json
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from pipeline import machine
from pipeline.config import PRESETS, load_config
from pipeline.machine import VECTOR_EXTENSIONS, cpu_description, environment, free_memory, model_description, model_line


@pytest.mark.parametrize("preset", list(PRESETS))
def test_every_preset_is_named_with_the_parameter_count_transformers_gives(preset, tmp_path):
    m = load_config(preset).model
    config = GPT2Config(n_layer=m.n_layer, n_head=m.n_head, n_embd=m.n_embd, n_positions=m.n_positions,
                        vocab_size=m.vocab_size)
    (tmp_path / "config.json").write_text(config.to_json_string())
    with torch.device("meta"):  # the count without allocating gpt2-xl's 6 GB
        expected = GPT2LMHeadModel(config).num_parameters()
    described = model_description(tmp_path)
    assert described["preset"] == preset and described["parameters"] == expected
    assert (described["layers"], described["hidden"], described["heads"]) == (m.n_layer, m.n_embd, m.n_head)


def test_a_shape_no_preset_has_is_custom_and_one_line_names_it(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"n_layer": 3, "n_head": 4, "n_embd": 128, "vocab_size": 50257,
                                                      "n_positions": 256}))
    described = model_description(tmp_path)
    assert described["preset"] == "custom"
    assert model_line(described) == f"custom, {described['parameters']:,} parameters (3 layers, 128 wide, 4 heads)"


def test_the_processor_and_its_vector_extensions_are_read():
    cpu = cpu_description()
    assert cpu["model"] and 1 <= cpu["usable_cores"] <= cpu["logical_cores"]
    assert cpu["torch_kernels"] == torch.backends.cpu.get_cpu_capability()
    if not Path("/proc/cpuinfo").exists():
        pytest.skip("the vector extensions are read from Linux's /proc/cpuinfo")
    flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith(("flags", "Features")))
    assert cpu["vector_extensions"] == [f for f in VECTOR_EXTENSIONS if f in flags.partition(":")[2].split()]
    assert environment(torch.device("cpu"))["cpu"] == cpu


def test_the_hosts_free_memory_is_its_available_memory_and_free_swap():
    if not Path("/proc/meminfo").exists():
        assert free_memory(torch.device("cpu")) is None
        return
    fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()}
    free = free_memory(torch.device("cpu"))
    assert 0 < free <= fields["MemTotal"] + fields.get("SwapTotal", 0)
    assert abs(free - fields["MemAvailable"] - fields.get("SwapFree", 0)) < 2**30  # read moments apart


def test_a_control_groups_memory_limit_below_the_hosts_free_memory_is_what_is_free(monkeypatch):
    monkeypatch.setattr(machine, "memory_headroom", lambda: 123 * 2**20)
    assert machine.free_memory(torch.device("cpu")) == 123 * 2**20
    monkeypatch.setattr(machine, "memory_headroom", lambda: 2**60)  # a limit above the host's memory: the host's
    assert machine.free_memory(torch.device("cpu")) < 2**60
