"""tests/runtime/static/test_cuda_graphs.py's sampled test (triton, fp32, seeded, penalised, top-k 40
and top-p 0.9 over a random model's flat logits) three times a variant of the sampler: this tree's,
this tree's without programmatic dependent launches, and the tree before's (.ab/old, one launch)
-> how often the graphed generation equals the plain one, and a plain one the plain one before it.
python3 docs/journal/probes/sampling_h200/graph_parity.py"""

import importlib.util
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from pipeline.runtime.generate import Generator
from pipeline.runtime.kernels.sampling_kernels import sample_rows
from pipeline.runtime.sampling import Sampling
from pipeline.runtime.static import triton_backend
from pipeline.runtime.static.triton_backend import TritonBackend

spec = importlib.util.spec_from_file_location("old_sampling", ".ab/old/pipeline/runtime/kernels/sampling_kernels.py")
old = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = old  # dataclasses look their module up
spec.loader.exec_module(old)
VARIANTS = {"this tree": sample_rows,
            "without pdl": lambda *a, pdl=False, **k: sample_rows(*a, **k),
            "tree before": lambda *a, pdl=False, **k: old.sample_rows(*a, **k)}
PADDED = [list(range(100, 100 + n)) for n in (5, 9, 3, 9)]
S = Sampling(max_new_tokens=24, do_sample=True, temperature=0.9, top_p=0.9, top_k=40, repetition_penalty=1.2,
             frequency_penalty=0.3, seed=17)
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=128, n_positions=256)).eval()
for name, fn in VARIANTS.items():
    triton_backend.sample_rows = fn
    same_graph = same_plain = 0
    previous = None
    for _ in range(3):
        plain = Generator(TritonBackend(model, "fp32", "cuda", cuda_graphs=False)).generate(PADDED, S)
        graphed = Generator(TritonBackend(model, "fp32", "cuda")).generate(PADDED, S)
        same_graph += graphed == plain
        same_plain += previous is None or plain == previous
        previous = plain
    print(f"sampler {name}: graphed == plain {same_graph}/3, plain == plain before {same_plain}/3", flush=True)
