"""The compiled PyTorch backend: StaticGPT2's decode step under torch.compile (Inductor), on a
static cache, captured into a CUDA graph on a GPU (see static_backend).

torch.compile's own CUDA-graph trees skip graphs that mutate their inputs (the KV cache), so the
step is captured by hand on the slot's fixed buffers, which is simple and works."""

from __future__ import annotations

import torch
from transformers import GPT2LMHeadModel

from pipeline.errors import UserError
from pipeline.runtime.static.static_backend import CacheSlot, StaticCacheBackend


class TorchCompiledBackend(StaticCacheBackend):
    name = "torch-compiled"

    def __init__(self, model: GPT2LMHeadModel, precision: str = "fp16", device: str | torch.device = "cuda",
                 compile: bool = True, cuda_graphs: bool | None = None):
        super().__init__(model, precision, device, cuda_graphs)
        self.compiled_step = torch.compile(self._step, fullgraph=True, dynamic=False) if compile else self._step

    def _step(self, token, position, slot_mask, start, cache):
        return self.net.decode_step(token, position, slot_mask, start, cache)[:, 0].float()

    def decode_step(self, s: CacheSlot) -> torch.Tensor:
        if self.row_local:  # uncompiled: each row's attention over its own slots is a shape of its own
            first = [f if live else None for f, live in zip(s.first.tolist(), s.advance[:, 0].tolist())]
            return self.net.decode_step(s.token, s.position, s.slot_mask, s.start, s.cache, first)[:, 0].float()
        return self.compiled_step(s.token, s.position, s.slot_mask, s.start, s.cache)

    def make_row_local(self) -> None:
        """Row-local on the CPU: each row's attention over its own slots (StaticGPT2.attend_rows), each row's
        draw alone (sampler.sample_rows_alone), and the serving scheduler's one batch shape, in which a
        product computes every row alike (tests/runtime/static/test_row_local.py checks the library does)."""
        if self.device.type != "cpu":
            raise UserError("--deterministic runs on the CPU: on a GPU the row-local step is not built yet "
                            "(docs/design.md, \"Deterministic serving\")")
        self.row_local = True
