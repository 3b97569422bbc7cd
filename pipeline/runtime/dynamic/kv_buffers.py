"""KV cache for graphs that take `past` and return `present = past + new` as a new tensor (the
ONNX contract, and TensorRT engines built from it).

Two buffers of the batch's maximum length are allocated once per reset. Each step reads `past`
from one and has the engine write `present` into the other, then they swap roles. A tensor of
shape [B, H, T, D] is laid out contiguously from its buffer's start, so nothing is allocated or
copied per step. The attention mask the graph takes is kept beside the cache (CacheMask)."""

from __future__ import annotations

import torch

from pipeline.contract import LOGITS, TOKEN_INPUTS, Contract
from pipeline.runtime.backend import Backend
from pipeline.runtime.batch import Batch, CacheMask

Binding = list[tuple[str, torch.Tensor]]  # (contract name, tensor) pairs


class PingPongKV:
    def __init__(self, contract: Contract, dtype: torch.dtype, device: torch.device, logits_dtype: torch.dtype):
        self.contract, self.dtype, self.device, self.logits_dtype = contract, dtype, device, logits_dtype
        self.n_tensors = 2 * contract.n_layer
        self.buffers: torch.Tensor | None = None
        self.mask = CacheMask()

    def reset(self, batch: int, max_len: int) -> None:
        c = self.contract
        size = batch * c.n_head * max_len * c.head_dim
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
        heads, head_dim = self.contract.n_head, self.contract.head_dim
        shape = lambda t: (batch, heads, t, head_dim)  # noqa: E731
        n_past, n_total = batch * heads * self.past_len * head_dim, batch * heads * total * head_dim
        past = [src[j, :n_past].view(shape(self.past_len)) for j in range(self.n_tensors)]
        present = [dst[j, :n_total].view(shape(total)) for j in range(self.n_tensors)]
        self._next = total
        return past, present

    def prefill_io(self, batch: Batch) -> tuple[Binding, Binding]:
        """What a prefill of a reset cache binds (io's pairs)."""
        self.mask.prefill(batch, self.max_len)
        return self.io(batch.input_ids, batch.attention_mask, batch.position_ids)

    def decode_io(self, tokens: torch.Tensor, positions: torch.Tensor) -> tuple[Binding, Binding]:
        """What a decode step binds: tokens and positions [B, 1], the cache's mask one slot longer."""
        return self.io(tokens, self.mask.step(), positions)

    def io(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> tuple[Binding, Binding]:
        """Everything one forward of the contract graph binds, by contract name: its inputs (the three
        int64 ones on the cache's device, then each past) and its outputs (each present, then logits
        [B, S, V], allocated here). Call `advance()` once the forward has run."""
        batch, seq = input_ids.shape
        past, present = self.step(batch, seq)
        feeds = [t.to(self.device, torch.int64).contiguous() for t in (input_ids, attention_mask, position_ids)]
        logits = torch.empty(batch, seq, self.contract.vocab_size, dtype=self.logits_dtype, device=self.device)
        c = self.contract
        return ([*zip(TOKEN_INPUTS, feeds), *zip(c.past_names, past)],
                [*zip(c.present_names, present), (LOGITS, logits)])

    def advance(self) -> None:
        self.flip, self.past_len = 1 - self.flip, self._next


class ContractGraphBackend(Backend):
    """A backend that runs the contract graph on a PingPongKV: a subclass binds and runs (run)."""
    kv: PingPongKV

    def run(self, inputs: Binding, outputs: Binding) -> None:
        raise NotImplementedError

    def reset(self, batch: int, max_len: int) -> None:
        self.kv.reset(batch, max_len)

    def forward(self, inputs: Binding, outputs: Binding) -> torch.Tensor:
        self.run(inputs, outputs)
        self.kv.advance()
        return outputs[-1][1]  # logits

    def prefill(self, batch: Batch, last_only: bool = True) -> torch.Tensor:
        logits = self.forward(*self.kv.prefill_io(batch))
        return (logits[:, -1:] if last_only else logits).float()

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.forward(*self.kv.decode_io(tokens, positions))[:, -1].float()
