"""The fast PyTorch backend: StaticGPT2 on a cache allocated once per (batch, max length), the
decode step under torch.compile and, on a GPU, captured once into a CUDA graph and replayed.

torch.compile's own CUDA-graph trees skip graphs that mutate their inputs (the KV cache), so the
decode step is captured by hand on fixed buffers, which is simple and works."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import GPT2LMHeadModel

from pipeline.runtime.static_gpt2 import StaticGPT2
from pipeline.runtime.torch_eager import TORCH_DTYPES

WARMUP_RUNS = 3  # before capture: lets compile and the allocator settle on a side stream


@dataclass
class _Slot:
    """Everything that must stay at a fixed address for one (batch, max_len)."""
    cache: list[torch.Tensor]  # 2L x [B, H, T, D]
    slot_mask: torch.Tensor  # [B, T] bool
    token: torch.Tensor  # [B, 1] decode input
    position: torch.Tensor  # [B, 1]
    start: torch.Tensor  # scalar int64: the slot the decode step writes
    graph: torch.cuda.CUDAGraph | None = None
    logits: torch.Tensor | None = None  # the captured graph's output buffer


class TorchCompiledBackend:
    name = "torch-compiled"

    def __init__(self, model: GPT2LMHeadModel, precision: str = "fp16", device: str | torch.device = "cuda",
                 compile: bool = True, cuda_graphs: bool | None = None):
        self.precision, self.device = precision, torch.device(device)
        self.n_positions, self.vocab_size = model.config.n_positions, model.config.vocab_size
        self.net = StaticGPT2(model, TORCH_DTYPES[precision]).to(self.device).eval()
        self.decode = torch.compile(self._decode, fullgraph=True, dynamic=False) if compile else self._decode
        self.cuda_graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        self.slots: dict[tuple[int, int], _Slot] = {}

    def _decode(self, token, position, slot_mask, start, cache):
        return self.net(token, position, slot_mask, start, cache)

    def reset(self, batch: int, max_len: int) -> None:
        key = (batch, max_len)
        if key not in self.slots:
            long = dict(dtype=torch.long, device=self.device)
            self.slots[key] = _Slot(self.net.new_cache(batch, max_len),
                                    torch.zeros(batch, max_len, dtype=torch.bool, device=self.device),
                                    torch.zeros(batch, 1, **long), torch.zeros(batch, 1, **long), torch.zeros((), **long))
        self.slot = self.slots[key]
        self.slot.slot_mask.zero_()

    @torch.inference_mode()
    def forward(self, input_ids, attention_mask, position_ids):
        s = self.slot
        batch, seq = input_ids.shape
        start = attention_mask.shape[1] - seq
        s.slot_mask[:, start:start + seq] = attention_mask[:, start:].bool()
        if seq > 1:  # prefill: variable length, eager
            return self.net(input_ids, position_ids, s.slot_mask, torch.tensor(start, device=self.device), s.cache).float()
        s.token.copy_(input_ids)
        s.position.copy_(position_ids)
        s.start.fill_(start)
        if not self.cuda_graphs:
            return self.decode(s.token, s.position, s.slot_mask, s.start, s.cache).float()
        if s.graph is None:
            self._capture(s)
        s.graph.replay()
        return s.logits.float()

    def _capture(self, s: _Slot) -> None:
        # warm-up writes land in the slot the real step is about to write anyway
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                self.decode(s.token, s.position, s.slot_mask, s.start, s.cache)
        torch.cuda.current_stream(self.device).wait_stream(side)
        s.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(s.graph):
            s.logits = self.decode(s.token, s.position, s.slot_mask, s.start, s.cache)
