"""One backend alone in a process: a warm-up, then 15 generations back to back (prompt 128, 128 new
tokens, greedy) of the same prompts, the tokens/s of each and their spread (max - min over median).
Usage: `python docs/journal/probes/cpu_bench_machine/one_backend_alone.py RUN_DIR BACKEND PRECISION BATCH`"""
import sys
import time
from pathlib import Path

import numpy as np
import torch

from pipeline.artifacts import RunDir
from pipeline.runtime.generate import Generator
from pipeline.runtime.loader import open_backend
from pipeline.runtime.sampling import Sampling

folder, name, precision, batch = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
generator = Generator(open_backend(RunDir(folder), name, precision, torch.device("cpu")))
prompts = np.random.RandomState(0).randint(0, 50000, (batch, 128)).tolist()
sampling = Sampling(max_new_tokens=128)
generator.generate(prompts, sampling)
rates = []
for _ in range(15):
    start = time.perf_counter()
    generator.generate(prompts, sampling)
    rates.append(128 * batch / (time.perf_counter() - start))
ordered = sorted(rates)
print(name, precision, batch, " ".join(f"{r:.0f}" for r in rates), f"spread {(ordered[-1] - ordered[0]) / ordered[7]:.2f}")
