"""Which int8 graph the CPU should get (#51): the run's fp32 ort graph against int8 rewrites of it,
MatMulNBits at accuracy level 4 (int8 weights in blocks, activations quantised per block: the CPU's
int8 graph until 2026-12-05) at block sizes 32 and 256, and DynamicQuantizeMatMul (int8 weights per
output column, activations quantised to uint8 per tensor: MLAS's integer GEMM) with 7-bit and 8-bit
weights. Each is checked against PyTorch fp32 as export checks a graph (relative logits error,
greedy tokens), then generated through ort-fused as bench runs it, prompt 128, 64 new tokens,
greedy, batch 1 and 8, the graphs timed in interleaved rounds (median). Under
`LD_PRELOAD=avx2_only.so` (avx2_only.c, next to this file) ONNX Runtime and torch pick the kernels
of a processor without AVX-512 or VNNI.
`PYTHONPATH=. python docs/journal/probes/cpu_int8/int8_graphs_ab.py artifacts/RUN` (a run whose ort
target was exported in fp32)."""
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import torch

from pipeline.accuracy import graph_parity, torch_reference
from pipeline.contract import ORT, Contract
from pipeline.data import TOKEN_DTYPE
from pipeline.export import ort_graph
from pipeline.machine import cpu_description
from pipeline.model import load_checkpoint
from pipeline.precisions import PRECISIONS
from pipeline.runtime.dynamic.ort_fused import OrtFusedBackend
from pipeline.runtime.generate import Generator
from pipeline.runtime.sampling import Sampling

run = Path(sys.argv[1])
ROUNDS, BATCHES, NEW = 3, (1, 8), 64
print(cpu_description(), "torch kernels:", torch.backends.cpu.get_cpu_capability())
work = Path(tempfile.mkdtemp())
fp32 = run / "onnx-ort" / "fp32" / "model.onnx"
graphs = {"fp32": fp32}


def nbits(block: int) -> onnx.ModelProto:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    quantizer = MatMulNBitsQuantizer(onnx.load(str(fp32)), bits=8, block_size=block, is_symmetric=True, accuracy_level=4)
    quantizer.process()
    return quantizer.model.model


def dynamic(top: int) -> onnx.ModelProto:
    ort_graph.DYNAMIC_INT8_TOP = top
    return ort_graph.INT8_MATMULS["DynamicQuantizeMatMul"](onnx.load(str(fp32)))


for name, write in [("nbits b32", lambda: nbits(32)), ("nbits b256", lambda: nbits(256)),
                    ("dynamic 7-bit", lambda: dynamic(63)), ("dynamic 8-bit", lambda: dynamic(127))]:
    graphs[name] = work / f"{name.replace(' ', '_')}.onnx"
    onnx.save(write(), str(graphs[name]))

model = load_checkpoint(run / "checkpoint")
held_out = np.memmap(run / "data" / "heldout.bin", dtype=TOKEN_DTYPE, mode="r")
prompts = [held_out[200 * i: 200 * i + 64 - 3 * i].astype(np.int64).tolist() for i in range(8)]
reference = torch_reference(model, prompts, 32)
for name, path in graphs.items():
    metrics, _ = graph_parity(path, "fp32" if name == "fp32" else "int8", model.config, reference, prompts, 32,
                              PRECISIONS["int8"].budget, ORT)
    print(f"{name:14s} vs PyTorch: rel error {metrics['rel_error']:.2e}, decode step {metrics['decode_rel_error']:.2e}, "
          f"greedy identical {metrics['identical_tokens']:.3f}")

config = json.loads((run / "onnx-ort" / "fp32" / "genai_config.json").read_text())["model"]
contract = Contract(config["decoder"]["num_hidden_layers"], config["decoder"]["num_attention_heads"],
                    config["decoder"]["head_size"], config["vocab_size"], ORT)
generators = {name: Generator(OrtFusedBackend(path, contract, "fp32" if name == "fp32" else "int8", "cpu"))
              for name, path in graphs.items()}
for batch in BATCHES:
    prompts = [list(range(100 + row, 228 + row)) for row in range(batch)]
    seconds = {name: [] for name in generators}
    for generator in generators.values():  # warm
        generator.generate(prompts, Sampling(max_new_tokens=NEW))
    for _ in range(ROUNDS):
        for name, generator in generators.items():
            start = time.perf_counter()
            generator.generate(prompts, Sampling(max_new_tokens=NEW))
            seconds[name].append(time.perf_counter() - start)
    print(f"batch {batch}, tokens/s (prefill included), median of {ROUNDS} (rounds): " + "; ".join(
        f"{name} {batch * NEW / statistics.median(s):.0f} ({', '.join(f'{batch * NEW / x:.0f}' for x in s)})"
        for name, s in seconds.items()))
