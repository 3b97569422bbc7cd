"""ONNX Runtime's own CUDA kernel options on the ort target's graphs (GPT-2 124M shape, random
weights, prompt 128, 128 new tokens): for each variant, the captured decode graph's GPU time per
step at batch 1 and 64 (300 replays, CUDA events, the best of 3), whether its greedy tokens match
the first variant of its precision, and one uncaptured batch-1 step's kernels (count, GPU time, the
heaviest). Variants set session config entries (the backend's CUDA_SESSION_CONFIG replaced) and
environment variables ONNX Runtime reads when it builds a kernel. Needs onnxruntime-gpu; from the
repository root: `PYTHONPATH=. python docs/journal/probes/ort_target_h200/kernel_options_probe.py`."""
import collections
import gc
import os
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import GPT2Config, GPT2LMHeadModel

from pipeline.contract import ORT, Contract
from pipeline.export.ort_graph import export_ort_graph
from pipeline.runtime import generate
from pipeline.runtime.dynamic import ort_fused
from pipeline.runtime.sampling import Sampling

TUNE = {"ep.cuda.enable_gemm_auto_tune": "1"}
INTB = {"ep.cuda.fpa_intb_gemm": "1"}
VARIANTS = [  # precision, name, session config, environment
    ("fp16", "cuBLAS (ONNX Runtime's default)", {}, {}),
    ("fp16", "GEMM auto-tune", TUNE, {}),
    ("fp16", "small-row GEMV forced", {}, {"ORT_ENABLE_SMALL_N_GEMV": "1"}),
    ("fp16", "GEMM auto-tune, XQA on", TUNE, {"ORT_ENABLE_XQA": "1"}),
    ("fp16", "GEMM auto-tune, XQA off", TUNE, {"ORT_ENABLE_XQA": "0"}),
    ("int8-wo", "MatMulNBits default", {}, {}),
    ("int8-wo", "fpA_intB weight-only kernels", INTB, {}),
    ("int8-wo", "fpA_intB + GEMM auto-tune", {**INTB, **TUNE}, {}),
]
dev = torch.device("cuda")
cfg = GPT2Config()
torch.manual_seed(0)
model = GPT2LMHeadModel(cfg).eval()
contract = Contract.from_hf_config(cfg, ORT)
paths = {}
for precision in ("fp16", "int8-wo"):
    paths[precision] = Path(f"/tmp/probe_{precision}/model.onnx")
    paths[precision].parent.mkdir(exist_ok=True)
    export_ort_graph(model, precision, paths[precision], 17)
samp = Sampling(max_new_tokens=128)
prompts = {rows: [list(range(100 + r, 228 + r)) for r in range(rows)] for rows in (1, 64)}


def replay_ms(be, n=300):
    c, best = be.cache, float("inf")
    for _ in range(3):
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(be.stream)
        for _ in range(n):
            be.session.run_with_iobinding(c.decode_binding, c.run_options)
        e1.record(be.stream)
        torch.cuda.synchronize()
        best = min(best, e0.elapsed_time(e1) / n)
    return best


def kernels(be):
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        be.session.run_with_iobinding(be.cache.decode_binding, be.prefill_options)  # uncaptured: its kernels show
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type.name == "CUDA"]
    by_name = collections.Counter()
    for e in events:
        by_name[e.name[:48]] += e.device_time
    top = ", ".join(f"{name} {us:.0f}" for name, us in by_name.most_common(4))
    return len(events), sum(e.device_time for e in events), top


first_tokens = {}
for precision, name, config, env in VARIANTS:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    ort_fused.CUDA_SESSION_CONFIG = config
    try:
        be = ort_fused.OrtFusedBackend(paths[precision], contract, precision, dev)
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    gen = generate.Generator(be)
    out = []
    for rows in (1, 64):
        for _ in range(2):  # the first captures the shape's graph
            tokens = torch.stack(list(gen.stream(prompts[rows], samp)))
        out.append(replay_ms(be))
        if rows == 1:
            same = first_tokens.setdefault(precision, tokens[:, 0].tolist()) == tokens[:, 0].tolist()
            count, total, top = kernels(be)
    print(f"{precision:7s} {name:34s} b1 {out[0]:.4f} ms  b64 {out[1]:.4f} ms  tokens {'same' if same else 'DIFFER'}  "
          f"| uncaptured b1: {count} kernels {total:.0f} us; {top}", flush=True)
    del gen, be
    gc.collect()
    torch.cuda.empty_cache()
