"""The ort target's fp16 batch-1 decode step with its projections as MatMul over [K, N] weights (as
exported) against com.microsoft.FusedMatMul with transB=1 over [N, K] (all projections, or the LM
head only): GPU time of 300 replays of the captured graph. Needs onnxruntime-gpu. From the
repository root: `PYTHONPATH=. python artifacts/results/ort_target_h200/fusedmatmul_probe.py`."""
from pathlib import Path
import numpy as np, onnx, torch
from onnx import helper, numpy_helper
from transformers import GPT2Config, GPT2LMHeadModel
from pipeline.contract import Contract, ORT
from pipeline.export.ort_graph import export_ort_graph
from pipeline.runtime.portable.ort_fused import OrtFusedBackend
from pipeline.runtime.generate import Generator
from pipeline.runtime.sampling import Sampling

dev = torch.device("cuda")
cfg = GPT2Config()
model = GPT2LMHeadModel(cfg).eval()
base = Path("/tmp/probe/model.onnx"); base.parent.mkdir(exist_ok=True)
export_ort_graph(model, "fp16", base, 17)

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
contract = Contract.from_hf_config(cfg, ORT)
prompt = [list(range(100, 228))]
for name, path in variants.items():
    be = OrtFusedBackend(path, contract, "fp16", dev)
    gen = Generator(be)
    for _ in range(2):
        toks = torch.stack(list(gen.stream(prompt, Sampling(max_new_tokens=64)))).view(-1)
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
    del be, gen
