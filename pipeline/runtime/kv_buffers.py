"""KV cache for graphs that take `past` and return `present = past + new` as a new tensor (the
ONNX contract, and TensorRT engines built from it).

Two buffers of the batch's maximum length are allocated once per reset. Each step reads `past`
from one and has the engine write `present` into the other, then they swap roles. A tensor of
shape [B, H, T, D] is laid out contiguously from its buffer's start, so nothing is allocated or
copied per step."""

from __future__ import annotations

import torch

CONTRACT_INPUTS = ("input_ids", "attention_mask", "position_ids")


class PingPongKV:
    def __init__(self, n_tensors: int, n_head: int, head_dim: int, dtype: torch.dtype, device: torch.device):
        self.n_tensors, self.n_head, self.head_dim, self.dtype, self.device = n_tensors, n_head, head_dim, dtype, device
        self.buffers: torch.Tensor | None = None

    def reset(self, batch: int, max_len: int) -> None:
        size = batch * self.n_head * max_len * self.head_dim
        if self.buffers is None or self.buffers.shape[2] < size:
            self.buffers = torch.empty(2, self.n_tensors, size, dtype=self.dtype, device=self.device)
        self.batch, self.max_len, self.past_len, self.flip = batch, max_len, 0, 0

    def step(self, batch: int, seq: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Views to bind for one forward of `seq` new tokens: past [B, H, P, D] and present
        [B, H, P + seq, D] per KV tensor. Call `advance()` once the forward has run."""
        total = self.past_len + seq
        if batch != self.batch or total > self.max_len:
            raise ValueError(f"forward of batch {batch} to length {total} on a cache reset for {self.batch} x {self.max_len}")
        src, dst = self.buffers[self.flip], self.buffers[1 - self.flip]
        shape = lambda t: (batch, self.n_head, t, self.head_dim)  # noqa: E731
        n_past, n_total = batch * self.n_head * self.past_len * self.head_dim, batch * self.n_head * total * self.head_dim
        past = [src[j, :n_past].view(shape(self.past_len)) for j in range(self.n_tensors)]
        present = [dst[j, :n_total].view(shape(total)) for j in range(self.n_tensors)]
        self._next = total
        return past, present

    def io(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
           past_names: list[str], present_names: list[str], logits_dtype: torch.dtype,
           vocab_size: int) -> tuple[list[tuple[str, torch.Tensor]], list[tuple[str, torch.Tensor]]]:
        """Everything one forward of the contract graph binds, as (name, tensor) pairs: its inputs
        (the three int64 ones on the cache's device, then each past) and its outputs (each present,
        then logits [B, S, V], allocated here). Call `advance()` once the forward has run."""
        batch, seq = input_ids.shape
        past, present = self.step(batch, seq)
        feeds = [t.to(self.device, torch.int64).contiguous() for t in (input_ids, attention_mask, position_ids)]
        logits = torch.empty(batch, seq, vocab_size, dtype=logits_dtype, device=self.device)
        return [*zip(CONTRACT_INPUTS, feeds), *zip(past_names, past)], [*zip(present_names, present), ("logits", logits)]

    def advance(self) -> None:
        self.flip, self.past_len = 1 - self.flip, self._next
