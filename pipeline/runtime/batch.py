"""A batch of prompts as the backends take it: left-padded to one length, with its attention mask
and positions, and the attention mask a cache of such rows keeps as decode steps append to it."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.errors import UserError


def send(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on the device, copied from page-locked memory so that the host does not wait for
    the device's queue (a pageable copy does); on a CPU, the tensor itself."""
    return host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host


@dataclass
class Batch:
    """Prompts left-padded to one length. host [3, B, S] int64: their ids, attention mask and positions
    on the host, the batch's own copy; padded: whether any row is (known on the host, so a backend need
    not ask the device). input_ids, attention_mask, position_ids [B, S] are the device's, sent on first
    use in one copy from page-locked memory: a backend that copies from the host itself (the static
    backends' prefill graphs) never needs them. Read-only: batches of one unpadded shape share their
    device mask and positions."""
    host: torch.Tensor
    device: torch.device
    padded: bool
    sent: tuple[torch.Tensor, ...] | None = None  # a padded batch's (ids, mask, positions) on the device, once sent
    sent_ids: torch.Tensor | None = None  # an unpadded batch's ids on the device, once sent

    @property
    def host_ids(self) -> torch.Tensor:
        return self.host[0]

    def padded_on_device(self) -> tuple[torch.Tensor, ...]:
        """A padded batch's (ids, mask, positions) on the device, in one copy without waiting (a pageable
        copy makes the host wait)."""
        if self.sent is None:
            self.sent = send(self.host, self.device).unbind(0)
        return self.sent

    @property
    def input_ids(self) -> torch.Tensor:
        if self.padded:
            return self.padded_on_device()[0]
        if self.sent_ids is None:
            self.sent_ids = send(self.host[0], self.device)
        return self.sent_ids

    def mask_and_positions(self) -> tuple[torch.Tensor, ...]:
        """(attention mask, positions) on the device: a padded batch's own, sent with its ids; an unpadded
        one's the shared ones of its shape."""
        if self.padded:
            return self.padded_on_device()[1:]
        return unpadded_mask_and_positions(*self.host.shape[1:], self.device)

    @property
    def attention_mask(self) -> torch.Tensor:
        return self.mask_and_positions()[0]

    @property
    def position_ids(self) -> torch.Tensor:
        return self.mask_and_positions()[1]


Prompts = list[list[int]] | np.ndarray  # token ids: a list per row, or one [B, S] integer array of equal rows


@functools.lru_cache(maxsize=8)
def unpadded_mask_and_positions(batch: int, width: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention mask and positions of rows without padding, made on the device once per shape:
    shared between batches, so read-only."""
    mask = torch.ones(batch, width, dtype=torch.int64, device=device)
    return mask, torch.arange(width, device=device).expand(batch, width).contiguous()


def left_pad(prompts: Prompts, pad_id: int, device: torch.device, width: int | None = None) -> Batch:
    """Pad on the left so every row's last prompt token is at the same column; positions count
    real tokens only (as Hugging Face's generate does), so padding does not shift them. Built in
    numpy; a padded batch goes to the device in one copy, since per-row tensors cost milliseconds.

    Nothing goes to the device here (Batch sends on first use); a batch without padding (one integer
    array, as a tokenizer's batch or the bench's prompts, or lists of one length) then sends its ids
    alone, the mask and positions of unpadded rows coming from unpadded_mask_and_positions, since every
    host operation here delays the prefill (docs/journal/performance.md).

    With `width`, lists are padded to at least that many columns and the batch counts as padded even
    where no row is: one shape, and one kind of prefill, for every batch of that width."""
    if isinstance(prompts, np.ndarray):
        if prompts.ndim != 2 or not prompts.shape[1] or prompts.dtype.kind not in "iu":
            raise UserError(f"prompts as an array must be integer token ids [batch, tokens] with at least one token; "
                            f"this one is {prompts.dtype} of shape {prompts.shape}")
        lengths, padded = None, False
        rows, columns = prompts.shape
    else:
        for i, p in enumerate(prompts):
            if not p:
                raise UserError(f"prompt {i} is empty: give at least one token")
        lengths = np.array([len(p) for p in prompts])
        rows, columns = len(prompts), max(int(lengths.max()), width or 0)
        padded = width is not None or bool((lengths < columns).any())
    # ids, mask and positions written in place into the one array the batch keeps (no temporaries to
    # stack: each costs tens of microseconds on a cold cache, on a served request's path)
    host = np.empty((3, rows, columns), dtype=np.int64)
    ids, mask, positions = host
    if lengths is None:
        ids[:] = prompts  # a copy: the caller's array is theirs
    else:
        ids.fill(pad_id)
        for row, p in zip(ids, prompts):
            row[columns - len(p):] = p
    if padded:
        np.greater_equal(np.arange(columns), columns - lengths[:, None], out=mask)
        np.cumsum(mask, axis=-1, out=positions)
        np.maximum(positions - 1, 0, out=positions)
    else:
        mask.fill(1)
        positions[:] = np.arange(columns)
    return Batch(torch.from_numpy(host), device, padded)


class CacheMask:
    """The attention mask of a cache that a prefill filled and decode steps append to, for graphs
    that take the mask as an input (the ONNX contract, Hugging Face's model): allocated once per
    prefill at the cache's full length, so a decode step binds a slice of it and copies nothing."""

    def __init__(self) -> None:
        self.mask: torch.Tensor | None = None
        self.length = 0

    def prefill(self, batch: Batch, max_len: int) -> None:
        rows, width = batch.attention_mask.shape
        self.mask = torch.ones(rows, max_len, dtype=torch.long, device=batch.attention_mask.device)
        self.mask[:, :width] = batch.attention_mask
        self.length = width

    def step(self) -> torch.Tensor:
        """The mask of a decode step: every slot so far and the new one, [B, length + 1]."""
        self.length += 1
        return self.mask[:, :self.length]
