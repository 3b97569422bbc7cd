"""Where a batch-1 decode step of the ort target's fp16 graph spends its time on a GPU (GPT-2 124M
shape, random weights): the step as bench times it, the captured graph's replays alone, the host's
share, one uncaptured step's kernels by the profiler; then the projections as com.microsoft.FusedMatMul
with transB=1 over [N, K] weights (all, or the LM head only) against MatMul over [K, N] (as
exported): GPU time of 300 replays of each captured graph (the recorded figures came from these
two parts run as two scripts). Needs onnxruntime-gpu; from the
repository root: `PYTHONPATH=. python docs/journal/probes/ort_target_h200/decode_probe.py`."""
import statistics
import time
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper
from transformers import GPT2Config, GPT2LMHeadModel

from pipeline.contract import ORT, Contract
from pipeline.export.ort_graph import export_ort_graph
from pipeline.runtime.dynamic.ort_fused import OrtFusedBackend
from pipeline.runtime.generate import Generator
from pipeline.runtime.sampling import Sampling

dev = torch.device("cuda")
cfg = GPT2Config()
model = GPT2LMHeadModel(cfg).eval()
base = path = Path("/tmp/probe/model.onnx"); path.parent.mkdir(exist_ok=True)
export_ort_graph(model, "fp16", path, 17)
contract = Contract.from_hf_config(cfg, ORT)
be = OrtFusedBackend(path, contract, "fp16", dev)
gen = Generator(be)
prompt = [list(range(100, 228))]
samp = Sampling(max_new_tokens=128)

def bench_like():
    start, marks = torch.cuda.Event(enable_timing=True), []
    t0 = time.perf_counter(); start.record()
    for _ in gen.stream(prompt, samp):
        marks.append(torch.cuda.Event(enable_timing=True)); marks[-1].record()
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    ts = [start.elapsed_time(m) for m in marks]
    return statistics.median([b - a for a, b in zip(ts[1:], ts[2:])]), host / len(marks) * 1e3

for _ in range(3): bench_like()
r = [bench_like() for _ in range(5)]
print("generator: step ms (events) p50 %.4f, host ms/step %.4f" % (statistics.median(x[0] for x in r), statistics.median(x[1] for x in r)))

c = be.cache
def raw(n=300, sync_each=False, with_ops=False):
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter(); e0.record(be.stream)
    for _ in range(n):
        if with_ops:
            with be._on_stream():
                c.positions.clamp_(max=200)
                be._step()
                c.logits[:, -1].argmax(-1)
        else:
            be.session.run_with_iobinding(c.decode_binding, c.run_options)
        if sync_each: torch.cuda.synchronize()
    host = (time.perf_counter() - t0) / n * 1e3
    e1.record(be.stream); torch.cuda.synchronize()
    return e0.elapsed_time(e1) / n, host
for kw in ({}, {"sync_each": True}, {"with_ops": True}):
    raw(50, **kw)
    print("raw replay", kw, "gpu ms/step %.4f host ms/step %.4f" % raw(**kw))

# torch ops alone, no ORT
def ops_only(n=300):
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(n):
        with be._on_stream():
            c.positions += 0
            c.tokens[:, 0] = 5
            c.mask.scatter_(1, c.positions, 1)
            c.logits[:, -1].argmax(-1)
    h = (time.perf_counter() - t0) / n * 1e3; torch.cuda.synchronize(); return h
print("torch ops + stream switch host ms/step %.4f" % ops_only())

# kernels in one uncaptured decode step
from torch.profiler import ProfilerActivity, profile

with profile(activities=[ProfilerActivity.CUDA]) as prof:
    be.session.run_with_iobinding(c.decode_binding, be.prefill_options)  # not captured: its kernels show
    torch.cuda.synchronize()
ev = [e for e in prof.events() if e.device_type.name == "CUDA"]
tot = sum(e.device_time for e in ev)
print("uncaptured step: %d kernels, %.1f us GPU total" % (len(ev), tot))
from collections import Counter

agg = Counter()
for e in ev: agg[e.name[:60]] += e.device_time
for k, v in agg.most_common(12): print("  %7.1f us  %s" % (v, k))


def transb(which):
    m = onnx.load(str(base))
    inits = {i.name: i for i in m.graph.initializer}
    for n in m.graph.node:
        if n.op_type == "MatMul" and n.input[1] in inits and which(n.name):
            init = inits[n.input[1]]
            arr = numpy_helper.to_array(init)
            init.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(arr.T), init.name))
            n.op_type, n.domain = "FusedMatMul", "com.microsoft"
            n.attribute.extend([helper.make_attribute("transB", 1)])
    p = base.with_name(f"v_{len(list(base.parent.glob('v_*')))}.onnx")
    onnx.save(m, str(p)); return p

variants = {"matmul": base, "fusedmatmul_all": transb(lambda n: True), "fusedmatmul_head": transb(lambda n: n == "lm_head")}
for name, path in variants.items():  # the captured graph alone, per weight layout
    be = OrtFusedBackend(path, contract, "fp16", dev)
    gen = Generator(be)
    for _ in range(2):
        toks = torch.stack(list(gen.stream(prompt, samp))).view(-1)
    c = be.cache
    res = []
    for _ in range(3):
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(be.stream)
        for _ in range(300):
            be.session.run_with_iobinding(c.decode_binding, c.run_options)
        e1.record(be.stream); torch.cuda.synchronize()
        res.append(e0.elapsed_time(e1) / 300)
    print(f"{name}: replay gpu ms/step b1 {min(res):.4f}  tokens[:6] {toks[:6].tolist()}", flush=True)
