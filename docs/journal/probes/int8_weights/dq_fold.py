"""A portable Q/DQ graph on ONNX Runtime's CPU provider with each weight's DequantizeLinear folded at
load (the ort backend as shipped) or run every step (per-run: the session option set back): load
time, one decode step's time at 8 rows, and its logits saved for comparing the two.
    python docs/journal/probes/int8_weights/dq_fold.py RUN PRECISION folded|per-run
(the run's onnx/PRECISION/model.onnx and checkpoint/config.json; logits to /tmp/dq_<mode>.pt)"""

import sys
import time
from pathlib import Path

import torch
from transformers import GPT2Config

from pipeline.contract import Contract
from pipeline.runtime.batch import left_pad
from pipeline.runtime.dynamic import ort_backend
from pipeline.runtime.dynamic.ort_backend import OrtBackend

ROWS, PROMPT, STEPS = 8, 64, 10


def main() -> None:
    run, precision, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    config = GPT2Config.from_json_file(str(run / "checkpoint" / "config.json"))
    if mode == "per-run":
        shipped = ort_backend.session_options

        def per_run(fuse_qdq, config=None):
            options = shipped(fuse_qdq, config)
            options.add_session_config_entry("session.disable_quant_qdq", "0")  # overwrites the shipped "1"
            return options
        ort_backend.session_options = per_run
    start = time.perf_counter()
    backend = OrtBackend(run / "onnx" / precision / "model.onnx", Contract.from_hf_config(config), precision,
                         torch.device("cpu"), config.n_positions)
    load = time.perf_counter() - start
    batch = left_pad([list(range(100, 100 + PROMPT))] * ROWS, 0, torch.device("cpu"))
    backend.reset(ROWS, PROMPT + STEPS + 2)
    backend.prefill(batch)
    tokens, positions = torch.arange(11, 11 + ROWS)[:, None], batch.position_ids[:, -1:] + 1
    logits = backend.decode(tokens, positions).clone()
    start = time.perf_counter()
    for i in range(STEPS):
        backend.decode(tokens, positions + 1 + i)
    print(f"{precision} {mode}: load {load:.2f} s, a decode step at {ROWS} rows {(time.perf_counter() - start) / STEPS * 1e3:.1f} ms")
    torch.save(logits, f"/tmp/dq_{mode}.pt")


if __name__ == "__main__":
    main()
