"""Optimum's ORTModelForCausalLM on its own export of a checkpoint, on the CPU: greedy, prompt 128,
64 new tokens, batch 1 and 8; the median of 3 timed generations after a warm-up.

It needs an environment of its own: optimum-onnx 0.1.0 requires transformers < 4.58, the pipeline
runs on 5.x. `python3 -m venv v && v/bin/pip install torch==2.13.0 "transformers<4.58"
"optimum-onnx[onnxruntime]==0.1.0" && v/bin/python optimum_bench.py RUN/checkpoint`"""
import json
import statistics
import sys
import time

import numpy as np
import onnxruntime
import optimum
import torch
import transformers
from optimum.onnxruntime import ORTModelForCausalLM

ckpt = sys.argv[1]
t = time.perf_counter()
model = ORTModelForCausalLM.from_pretrained(ckpt, export=True, use_cache=True)
load_s = time.perf_counter() - t
rng = np.random.default_rng(0)
out = {"optimum_onnx": getattr(optimum, "__version__", "?"), "transformers": transformers.__version__,
       "onnxruntime": onnxruntime.__version__, "torch": torch.__version__, "export_and_load_s": round(load_s, 1)}
for batch in (1, 8):
    ids = torch.tensor(rng.integers(0, 50000, (batch, 128)))
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=64, min_new_tokens=64, do_sample=False, pad_token_id=0)
    model.generate(ids, **kw)
    times = []
    for _ in range(3):
        t = time.perf_counter(); model.generate(ids, **kw); times.append(time.perf_counter() - t)
    out[f"batch_{batch}"] = {"tokens_per_s": round(batch * 64 / statistics.median(times), 1),
                             "runs_s": [round(x, 2) for x in times]}
    print(batch, out[f"batch_{batch}"], flush=True)
print(json.dumps(out))
