"""GPU time (and the host's launch time) of 127 greedy steps of the triton fp16 backend at 1 and 64 rows,
with each way of reading a step's tokens back: none, an event per step (as bench times), a copy to
page-locked memory and an event on the compute stream (the serving scheduler before this change), the
copy on a stream of its own (after). From the repository root, on a GPU:
`python docs/journal/probes/serve_h200_copy_stream/readback_probe.py RUN_DIR` (a run `finetune` wrote)."""
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, ".")
from pipeline.artifacts import RunDir
from pipeline.runtime.batch import left_pad
from pipeline.runtime.session import open_named_backend

run = Path(sys.argv[1])
dev = torch.device("cuda")
b = open_named_backend(RunDir(run), "triton", "fp16", dev)
prompt = [list(range(1000, 1128))]
host = [torch.empty(64, dtype=torch.long, pin_memory=True) for _ in range(256)]
side = torch.cuda.Stream(dev)
def run_pass(mode, rows=1):
    batch = left_pad(prompt * rows, 50256, dev)
    b.reset(rows, 128 + 128)
    token = b.prefill(batch)[:, -1].argmax(-1)
    pos = batch.position_ids[:, -1:] + 1
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(); evs = []; h0 = time.perf_counter()
    for i, t in enumerate(b.greedy_steps(token, pos, 127)):
        if mode == "event":
            e = torch.cuda.Event(); e.record(); evs.append(e)
        elif mode == "copy":
            host[i][:rows].copy_(t, non_blocking=True); e = torch.cuda.Event(); e.record(); evs.append(e)
        elif mode == "side":
            e = torch.cuda.Event(); e.record(); side.wait_event(e)
            with torch.cuda.stream(side):
                host[i][:rows].copy_(t, non_blocking=True)
            r = torch.cuda.Event(); r.record(side); evs.append(r)
    hms = (time.perf_counter() - h0) * 1e3
    end.record(); torch.cuda.synchronize()
    return start.elapsed_time(end), hms
with torch.inference_mode():
    for rows in (1, 64):
        for mode in ["none", "event", "copy", "side"] * 2:
            run_pass(mode, rows)
        res = {m: [] for m in ["none", "event", "copy", "side"]}
        for _ in range(15):
            for m in res:
                res[m].append(run_pass(m, rows))
        print(f"rows {rows}: " + "  ".join(f"{m} {statistics.median(g for g, _ in v) / 127 * 1e3:.2f} us/step gpu, {statistics.median(h for _, h in v) / 127 * 1e3:.1f} host" for m, v in res.items()))
