"""A timestamp per hop, appended to /tmp/trlog/PID.log (the traced copy of a tree imports it)."""
import os
import time

_f = None
def t(label):
    global _f
    if _f is None:
        _f = open(f"/tmp/trlog/{os.getpid()}.log", "a", buffering=1)
    _f.write(f"{time.perf_counter():.6f} {label}\n")

# GPU timestamps of one join: p0 (before the prefill replay) arms; every ev() after it records an event
# and the host time; evflush() at the first take after g1 writes the GPU times since p0 and the host times
_ev, _armed, _g = [], False, None
def ev(label):
    global _armed
    if label == "p0":
        _armed = True; _ev.clear()
    if not _armed:
        return
    import torch
    e = torch.cuda.Event(enable_timing=True); e.record(); _ev.append((label, e, time.perf_counter()))
def evflush():
    global _armed, _g
    if not _armed or not any(l == "g1" for l, _, _ in _ev):
        return
    _armed = False
    _ev[-1][1].synchronize()
    if _g is None:
        _g = open(f"/tmp/trlog/gpu_{os.getpid()}.txt", "a", buffering=1)
    l0, e0, h0 = _ev[0]
    _g.write(" ".join(f"{l}:{e0.elapsed_time(e):.3f}/{(h - h0) * 1e3:.3f}" for l, e, h in _ev[1:]) + "\n")
    _ev.clear()
