"""onnxruntime-genai on the ort target's fp32 folder with its default threads (0) or N intra-op
threads set through a config overlay, as the ort-genai backend does: decode tokens/s (127 steps
after a 128-token prompt), three generations at batch 1, two at batch 8, one process.
Usage: `python docs/journal/probes/cpu_bench_machine/genai_threads/genai_threads_probe.py FOLDER N [N ...]`"""
import json
import sys
import time

import numpy as np
import onnxruntime_genai as og


def model(folder: str, threads: int):
    config = og.Config(folder)
    if threads:
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}))
    return og.Model(config)


def decode_rate(m, batch: int) -> float:
    params = og.GeneratorParams(m)
    params.set_search_options(max_length=256, batch_size=batch, do_sample=False)
    generator = og.Generator(m, params)
    generator.append_tokens(np.random.RandomState(0).randint(0, 50000, (batch, 128)).astype(np.int32))
    start = time.perf_counter()
    for _ in range(127):
        generator.generate_next_token()
    return 127 * batch / (time.perf_counter() - start)


folder = sys.argv[1]
for threads in map(int, sys.argv[2:]):
    m = model(folder, threads)
    decode_rate(m, 1)
    print(f"intra-op threads {threads or 'default'}: batch 1", " ".join(f"{decode_rate(m, 1):.0f}" for _ in range(3)),
          "| batch 8", " ".join(f"{decode_rate(m, 8):.0f}" for _ in range(2)), flush=True)
