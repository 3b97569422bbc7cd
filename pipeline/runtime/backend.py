"""What every execution backend provides to the generation runtime: a prefill and a decode step.

A backend runs the model and keeps the KV cache of the batch it is working on; the generator owns
tokens, sampling and stopping. Each row of a batch carries its own positions (left padding shifts
them), and the backend keeps which cache slots of each row hold real tokens, so a decode step needs
only each row's token and position. Tensors cross this boundary as torch tensors on the backend's
device, the prefill's ids also on the host (Batch.host_ids) for backends that copy them themselves.

Three capabilities are optional and explicit. fused_greedy: the backend runs plain greedy decoding
itself (greedy_steps), feeding each argmax back with no host work per token (the static-cache
backends on a GPU replay one CUDA graph a token). fused_sampling: likewise for sampled decoding
(sampled_steps), each row drawn on the device by the settings in the backend's sampling_table().
own_scoring: the backend gives every position's logits of a sequence through its own prefill
(sequence_logits) between two steps of a generation, leaving that generation as it was."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from pipeline.runtime.batch import Batch
from pipeline.runtime.sampling_table import SamplingTable


class Backend:
    name: str  # a key of loader.BACKENDS
    precision: str  # a key of precisions.PRECISIONS
    device: torch.device
    n_positions: int  # context limit: prompt + generated tokens
    vocab_size: int
    fused_greedy = False  # whether greedy_steps is offered
    fused_sampling = False  # whether sampled_steps and sampling_table are offered
    own_scoring = False  # whether sequence_logits is offered
    max_rows: int | None = None  # the most rows the runtime takes at once; None: as many as memory holds
    # a runtime with a thread pool of its own on the CPU (ONNX Runtime): the torch ops around its steps
    # then run on one thread, since torch's OpenMP workers, spinning after each op, take the cores from
    # it (docs/journal/performance.md, "The CPU bench")
    owns_cpu_threads = False

    def reset(self, batch: int, max_len: int) -> None:
        """Prepare an empty KV cache for `batch` rows of at most `max_len` tokens."""
        raise NotImplementedError

    def prefill(self, batch: Batch, last_only: bool = True) -> torch.Tensor:
        """The prompts of a reset cache -> logits [B, S, V] fp32, or [B, 1, V] of each row's last
        position with last_only (generation needs no more, and the LM head over a whole prompt
        costs more than the rest of a batch-64 prefill). May be a buffer the next call rewrites."""
        raise NotImplementedError

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One new token per row, tokens and positions [B, 1] int64, appended to the cache ->
        logits [B, V] fp32. May be a buffer the next call rewrites."""
        raise NotImplementedError

    def greedy_steps(self, token: torch.Tensor, position: torch.Tensor, count: int) -> Iterator[torch.Tensor]:
        """With fused_greedy, after a prefill: token [B] goes in at position [B, 1], then each step's
        argmax feeds the next. Yields `count` tokens [B], valid until the next generation."""
        raise NotImplementedError(f"{self.name} has no fused greedy decoding")

    def sampling_table(self) -> SamplingTable:
        """With fused_sampling, after a reset: the per-row settings sampled_steps reads, to fill."""
        raise NotImplementedError(f"{self.name} has no fused sampling")

    def sampled_steps(self, token: torch.Tensor, position: torch.Tensor, count: int) -> Iterator[torch.Tensor]:
        """As greedy_steps, each step's tokens drawn by the rows' settings in sampling_table()."""
        raise NotImplementedError(f"{self.name} has no fused sampling")

    def sequence_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """With own_scoring, at any time: one sequence's ids [S] int64 on the host -> its logits [S, V] at every position."""
        raise NotImplementedError(f"{self.name} has no scoring of its own")


class BackendUnavailable(Exception):
    """A backend cannot run here (library or device missing); the message says why."""
