"""The device sampler alone on the GPU: one launch over random logits of GPT-2's vocabulary, captured in
a CUDA graph and replayed, per row count and settings -> microseconds a launch. Logits of spread 4
are about a trained GPT-2's; of spread 1 about an untrained one's (a flat distribution: a top-p draw's
acceptance pass reads every block).
python3 docs/journal/probes/sampling_h200/sampler_timing.py"""

import torch

from pipeline.runtime.sampler import sample
from pipeline.runtime.sampling import Sampling
from pipeline.runtime.sampling_table import SamplingTable

SETTINGS = {"greedy": Sampling(), "t0.8 top_p0.95": Sampling(do_sample=True, temperature=0.8, top_p=0.95, seed=1),
            "t1.0": Sampling(do_sample=True, temperature=1.0, seed=2),
            "t0.7 top_k50 penalties": Sampling(do_sample=True, temperature=0.7, top_k=50, repetition_penalty=1.2,
                                               frequency_penalty=0.5, seed=3)}
torch.manual_seed(0)
for spread, rows in [(4, 1), (4, 8), (4, 64), (1, 1), (1, 64)]:
    logits = torch.randn(rows, 50257, device="cuda") * spread
    positions = torch.arange(rows, device="cuda")
    out = torch.empty(rows, dtype=torch.long, device="cuda")
    line = []
    for name, s in SETTINGS.items():
        table = SamplingTable.new(rows, 50257, torch.device("cuda"))
        table.fill(list(range(rows)), [(s, i) for i in range(rows)], [[1, 2, 3]] * rows)
        for _ in range(3):
            sample(logits, table, positions, out=out)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(20):
                sample(logits, table, positions, out=out)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        graph.replay()
        start.record()
        for _ in range(10):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        line.append(f"{name} {start.elapsed_time(end) * 1e3 / 200:.1f} us")
    print(f"sampler spread {spread} rows {rows}: " + "; ".join(line))
