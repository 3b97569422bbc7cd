"""Host time of the join's small operations on a GPU machine: warm (back to back) and cold (64 MiB
of memory written between calls, as a lone request finds the caches after the HTTP side and the
last stream ran). Run from the repository root: python docs/journal/probes/serve_h200_lean_join/host_ops.py"""
import sys
import time

import numpy as np
import torch

sys.path.insert(0, ".")
from pipeline.runtime.batch import left_pad, send

dev = torch.device("cuda")
junk = np.ones(64 * 2**20 // 8)
x = torch.zeros(64, device=dev); big = torch.zeros(4, 2048, device=dev)
pinned = torch.empty(3, 64, dtype=torch.long, pin_memory=True); target = torch.empty(3, 64, dtype=torch.long, device=dev)
ev = torch.cuda.Event()
prompt = list(range(1000, 1128))
ops = {
  "torch.tensor 3x1": lambda: torch.tensor([[3], [128], [0]]),
  "send 3x1": lambda: send(torch.tensor([[3], [128], [0]]), dev),
  "pin_memory 3x1": lambda: torch.tensor([[3], [128], [0]]).pin_memory(),
  "staged copy (numpy into pinned, one H2D)": lambda: (pinned.numpy().__setitem__((slice(None), 0), (3, 128, 0)), target.copy_(pinned, non_blocking=True)),
  "left_pad 1x128 w128 (host only)": lambda: left_pad([prompt], 50256, dev, 128),
  "fill_ kernel": lambda: x.fill_(0),
  "index_fill_": lambda: big.index_fill_(0, torch.zeros(1, dtype=torch.long, device=dev), 0),
  "event record": lambda: ev.record(),
}
for name, f in ops.items():
    res = {}
    for mode in ("warm", "cold"):
        ts = []
        for i in range(300):
            if mode == "cold":
                junk.__iadd__(1)
            torch.cuda.synchronize()
            t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
        res[mode] = np.median(ts[20:]) * 1e6
    print(f"{name:45s} warm {res['warm']:7.1f} us   cold {res['cold']:7.1f} us")
