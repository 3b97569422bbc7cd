"""Generation over any backend: left-padded batches, prefill, decode steps, sampling, stop
tokens, and a streaming iterator. Validate, bench and serve all generate through here."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.errors import UserError
from pipeline.runtime.backend import Backend
from pipeline.runtime.sampling import Sampling, next_tokens


@dataclass
class Batch:
    """Prompts left-padded to one length. host_ids [B, S] int64: the batch's own copy on the host;
    input_ids, attention_mask, position_ids [B, S] on the device; padded: whether any row is (known
    on the host, so a backend need not ask the device). Read-only: batches of one unpadded shape
    share their mask and positions."""
    host_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    padded: bool
    sent_ids: torch.Tensor | None = None  # input_ids, once sent

    @property
    def input_ids(self) -> torch.Tensor:
        """The ids on the device, sent on first use: a backend that takes host ids never needs them.
        Sent from page-locked memory, without waiting: on an H200's host a pageable copy of 64 x 128
        tokens took 0.24 ms right after a generation, 0.035 ms pinned."""
        if self.sent_ids is None:
            device = self.attention_mask.device
            host = self.host_ids.pin_memory() if device.type == "cuda" else self.host_ids
            self.sent_ids = host.to(device, non_blocking=True)
        return self.sent_ids


Prompts = list[list[int]] | np.ndarray  # token ids: a list per row, or one [B, S] integer array of equal rows


@functools.lru_cache(maxsize=8)
def unpadded_mask_and_positions(batch: int, width: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention mask and positions of rows without padding, made on the device once per shape:
    shared between batches, so read-only."""
    mask = torch.ones(batch, width, dtype=torch.int64, device=device)
    return mask, torch.arange(width, device=device).expand(batch, width).contiguous()


def left_pad(prompts: Prompts, pad_id: int, device: torch.device) -> Batch:
    """Pad on the left so every row's last prompt token is at the same column; positions count
    real tokens only (as Hugging Face's generate does), so padding does not shift them. Built in
    numpy; a padded batch goes to the device in one copy (per-row torch tensors cost milliseconds at
    batch 64).

    A batch without padding (one integer array, as a tokenizer's batch or the bench's prompts, or
    lists of one length) sends nothing: its ids go to the device when first asked for (Batch), and
    the mask and positions of unpadded rows come from unpadded_mask_and_positions. Every host
    operation here delays the prefill, and right after a generation the host runs them slowly: on an
    H200's host each took 20-120 us there."""
    if isinstance(prompts, np.ndarray):
        if prompts.ndim != 2 or not prompts.shape[1] or prompts.dtype.kind not in "iu":
            raise UserError(f"prompts as an array must be integer token ids [batch, tokens] with at least one token; "
                            f"this one is {prompts.dtype} of shape {prompts.shape}")
        ids, padded = np.array(prompts, dtype=np.int64, order="C"), False  # a copy: the caller's array is theirs
    else:
        for i, p in enumerate(prompts):
            if not p:
                raise UserError(f"prompt {i} is empty: give at least one token")
        lengths = np.array([len(p) for p in prompts])
        ids = np.full((len(prompts), int(lengths.max())), pad_id, dtype=np.int64)
        for row, p in zip(ids, prompts):
            row[ids.shape[1] - len(p):] = p
        padded = bool((lengths < ids.shape[1]).any())
    if not padded:
        return Batch(torch.from_numpy(ids), *unpadded_mask_and_positions(*ids.shape, device), padded=False)
    # one copy to the device, from page-locked memory (Batch.input_ids)
    width = ids.shape[1]
    mask = (np.arange(width)[None, :] >= width - lengths[:, None]).astype(np.int64)
    positions = np.maximum(mask.cumsum(-1) - 1, 0)
    host = torch.empty((3, *ids.shape), dtype=torch.int64, pin_memory=device.type == "cuda")
    np.stack([ids, mask, positions], out=host.numpy())
    sent_ids, mask, positions = host.to(device, non_blocking=True).unbind(0)
    return Batch(torch.from_numpy(ids), mask, positions, padded=True, sent_ids=sent_ids)


class Generator:
    def __init__(self, backend: Backend, pad_id: int = 50256):
        self.backend, self.pad_id = backend, pad_id

    def check_length(self, prompt_len: int, max_new_tokens: int) -> None:
        limit = self.backend.n_positions
        if prompt_len + max_new_tokens > limit:
            raise UserError(f"a prompt of {prompt_len} tokens plus max_new_tokens={max_new_tokens} exceeds the model's "
                            f"context of {limit} tokens; shorten the prompt or lower max_new_tokens")

    def stream(self, prompts: Prompts, s: Sampling) -> Iterator[torch.Tensor]:
        """Yield the next token of every row, [B], once per step. Rows that have stopped yield pad_id.

        The hot loop stays on the device: the attention mask is preallocated and sliced, plain greedy
        decoding goes to the backend's greedy_steps where it has one, and the host waits on the
        device only where stop tokens require a look at the tokens."""
        s.check()
        batch = left_pad(prompts, self.pad_id, self.backend.device)
        b, width = batch.host_ids.shape
        self.check_length(width, s.max_new_tokens)
        device = self.backend.device
        generator = torch.Generator(device).manual_seed(s.seed) if s.seed is not None else None
        self.backend.reset(b, width + s.max_new_tokens)
        seen = batch.input_ids if s.repetition_penalty != 1.0 else None  # only the penalty needs history
        # plain greedy decoding on a backend that feeds each argmax back itself: no host work per token
        greedy = getattr(self.backend, "greedy_steps", None) if not s.do_sample and seen is None else None
        # what only some paths read is made only for them: before the prefill every op is host time the
        # first token waits for (on an H200's host 15-20 us each at batch 64)
        if not greedy:
            mask = torch.ones(b, width + s.max_new_tokens, dtype=torch.long, device=device)
            mask[:, :width] = batch.attention_mask
        stops = torch.tensor(s.stop_tokens, dtype=torch.long, device=device) if s.stop_tokens else None
        done = torch.zeros(b, dtype=torch.bool, device=device) if stops is not None else None
        ids = batch.host_ids if getattr(self.backend, "takes_host_ids", False) else batch.input_ids
        logits = self.backend.forward(ids, batch.attention_mask, batch.position_ids, last_only=True,
                                      padded=batch.padded)[:, -1]
        position = batch.position_ids[:, -1:]
        token = next_tokens(logits, seen, s, generator)
        followers = greedy(token, position + 1, width, s.max_new_tokens - 1) if greedy else None
        for step in range(s.max_new_tokens):
            if step and followers is not None:
                token = next(followers)
            elif step:
                if seen is not None:
                    seen = torch.cat([seen, token[:, None]], 1)
                position = position + 1
                logits = self.backend.forward(token[:, None], mask[:, :width + step], position)[:, -1]
                token = next_tokens(logits, seen, s, generator)
            if stops is not None:
                token = token.masked_fill(done, self.pad_id)
            yield token
            if step == s.max_new_tokens - 1:
                return
            if stops is not None:
                done |= torch.isin(token, stops)
                if bool(done.all()):
                    return

    def generate(self, prompts: Prompts, s: Sampling) -> list[list[int]]:
        """New tokens of each prompt, up to and including its first stop token."""
        steps = [t.cpu() for t in self.stream(prompts, s)]
        out = []
        for row in torch.stack(steps, 1).tolist() if steps else [[] for _ in prompts]:
            cut = next((i + 1 for i, t in enumerate(row) if t in s.stop_tokens), len(row))
            out.append(row[:cut])
        return out
