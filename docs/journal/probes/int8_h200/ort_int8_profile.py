"""Why the ort target's int8-wo graph is slower than its fp16 graph on a GPU (#51): GPT-2 124M
shape, random weights; the fp16 graph, MatMulNBits over int8 weights in blocks of 32 (as exported)
and of 128, and over int4 weights in blocks of 32 (ONNX Runtime's other weight width, for
comparison). Each: ms a step of 300 replays of the captured batch-1 decode graph (CUDA events), the
tokens of one greedy run, then one uncaptured step's kernels by the profiler, the largest by time.
Needs onnxruntime-gpu; from the repository root: `PYTHONPATH=. python3 docs/journal/probes/int8_h200/ort_int8_profile.py`."""
import logging
from collections import Counter
from pathlib import Path

import onnx
import torch
from torch.profiler import ProfilerActivity, profile
from transformers import GPT2Config, GPT2LMHeadModel

from pipeline.contract import ORT, Contract
from pipeline.export.ort_graph import build_ort_graph
from pipeline.runtime.dynamic.ort_fused import OrtFusedBackend
from pipeline.runtime.generate import Generator
from pipeline.runtime.sampling import Sampling

torch.manual_seed(0)
cfg = GPT2Config()
model = GPT2LMHeadModel(cfg).eval()
state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
contract = Contract.from_hf_config(cfg, ORT)
folder = Path("/tmp/ort_int8_probe")
folder.mkdir(exist_ok=True)
prompt = [list(range(100, 228))]
logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)


def graph(bits: int | None, block: int) -> tuple[Path, str]:
    import numpy as np
    g = build_ort_graph(state, cfg, np.float16, 17)
    if bits:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
        q = MatMulNBitsQuantizer(g, bits=bits, block_size=block, is_symmetric=True, accuracy_level=0)
        q.process()
        g = q.model.model
    path = folder / f"model_{bits or 16}_{block}.onnx"
    onnx.save(g, str(path))
    return path, "int8-wo" if bits else "fp16"


for name, bits, block in (("fp16", None, 0), ("int8 b32", 8, 32), ("int8 b128", 8, 128), ("int4 b32", 4, 32)):
    path, precision = graph(bits, block)
    be = OrtFusedBackend(path, contract, precision, "cuda")
    gen = Generator(be)
    tokens = None
    for _ in range(2):
        tokens = torch.stack(list(gen.stream(prompt, Sampling(max_new_tokens=128)))).view(-1)
    c = be.cache
    times = []
    for _ in range(3):
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(be.stream)
        for _ in range(300):
            be.session.run_with_iobinding(c.decode_binding, c.run_options)
        e1.record(be.stream)
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) / 300)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        be.session.run_with_iobinding(c.decode_binding, be.prefill_options)  # not captured: its kernels show
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    by_name = Counter()
    for e in kernels:
        by_name[e.name[:70]] += e.device_time
    print(f"{name}: replay {min(times):.4f} ms a step; uncaptured {len(kernels)} kernels, "
          f"{sum(e.device_time for e in kernels):.1f} us; tokens[:8] {tokens[:8].tolist()}", flush=True)
    for kernel, us in by_name.most_common(6):
        print(f"    {us:7.1f} us  {kernel}")
    del be, gen
