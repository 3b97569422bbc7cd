"""What every execution backend provides to the generation runtime.

A backend runs one forward of the contract graph (prefill or decode) and keeps the KV cache of
the batch it is working on. The generator owns tokens, masks, positions and sampling; a backend
owns only how the model is executed. Tensors cross this boundary as torch tensors on the
backend's device.

A backend may also offer greedy_steps (the static-cache backends do, see static_backend): then the
generator hands plain greedy decoding to it, and the backend feeds each argmax back itself. And it
may set takes_host_ids: then a prefill's input_ids may come on the host, for the backend to move
(the static-cache backends' prefill graphs copy them as their first node)."""

from __future__ import annotations

from typing import Protocol

import torch

BACKENDS = ("torch", "torch-compiled", "triton", "ort", "trt")
PRECISIONS = ("fp32", "fp16", "int8", "int8-wo")


class Backend(Protocol):
    name: str  # one of BACKENDS
    precision: str  # one of PRECISIONS
    device: torch.device
    n_positions: int  # context limit: prompt + generated tokens
    vocab_size: int

    def reset(self, batch: int, max_len: int) -> None:
        """Prepare an empty KV cache for `batch` sequences of at most `max_len` tokens."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                last_only: bool = False, padded: bool | None = None) -> torch.Tensor:
        """input_ids/position_ids [B, S], attention_mask [B, past + S] (int64) -> logits [B, S, V] fp32
        ([B, 1, V] with last_only: generation needs no more, and the LM head over a whole prompt
        costs more than the rest of a batch-64 prefill). Appends the S new positions to the cache.
        padded: whether attention_mask holds any 0, where the caller knows; a backend whose attention
        differs for unpadded rows would otherwise have to wait for the device to tell (None: unknown).
        The result may be a buffer the next call rewrites: use or copy it before calling again."""


class BackendUnavailable(Exception):
    """A backend cannot run here (library or device missing); the message says why."""
