"""Optimisation profiles as data: (min, opt, max) shapes per graph input, derived from the ONNX
contract and the `[engine]` config. One profile serves prefill (seq up to max_seq, past 0) and
decode (seq 1, past up to max_len - 1); TensorRT handles the empty past tensor of a prefill."""

from __future__ import annotations

from pipeline.config import EngineConfig
from pipeline.contract import BATCH, PAST, SEQ, TOTAL, Contract

Shape = tuple[int, ...]


def profile_shapes(contract: Contract, e: EngineConfig) -> dict[str, tuple[Shape, Shape, Shape]]:
    # symbol -> (min, opt, max); opt is the decode step the engine spends most of its time in
    dims = {BATCH: (e.min_batch, e.opt_batch, e.max_batch), SEQ: (1, e.opt_seq, e.max_seq),
            PAST: (0, e.opt_len - e.opt_seq, e.max_len - 1), TOTAL: (1, e.opt_len, e.max_len)}
    shapes = {}
    for t in contract.inputs:
        triple = [tuple(dims[a][k] if isinstance(a, str) else a for a in t.axes) for k in range(3)]
        shapes[t.name] = (triple[0], triple[1], triple[2])
    return shapes
