"""Generation over any backend: a prefill, then sample / yield / decode until each row stops or
has its tokens, as a streaming iterator. Validate, bench and serve all generate through here."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from pipeline.errors import UserError
from pipeline.runtime.backend import Backend
from pipeline.runtime.batch import Prompts, left_pad
from pipeline.runtime.sampler import sample
from pipeline.runtime.sampling import Sampling
from pipeline.runtime.sampling_table import SamplingTable


def check_length(prompt_len: int, max_new_tokens: int, limit: int, option: str = "max_new_tokens") -> None:
    """A UserError naming the limit when a prompt and its new tokens do not fit the model's context."""
    if prompt_len + max_new_tokens > limit:
        raise UserError(f"a prompt of {prompt_len} tokens plus {option}={max_new_tokens} exceeds the model's "
                        f"context of {limit} tokens; shorten the prompt or lower {option}")


@contextlib.contextmanager
def host_threads(backend: Backend):
    """torch on one thread while a backend that owns the CPU's threads generates (Backend.owns_cpu_threads)."""
    if not (backend.owns_cpu_threads and backend.device.type == "cpu"):
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class Generator:
    def __init__(self, backend: Backend, pad_id: int = 50256):
        self.backend, self.pad_id = backend, pad_id

    def check_length(self, prompt_len: int, max_new_tokens: int) -> None:
        check_length(prompt_len, max_new_tokens, self.backend.n_positions)

    def stream(self, prompts: Prompts, sampling: Sampling) -> Iterator[torch.Tensor]:
        """Yield the next token of every row, [B], once per step. Rows that have stopped yield pad_id.
        The host waits on the device only where stop tokens require a look at the tokens."""
        with host_threads(self.backend):
            yield from self.tokens(prompts, sampling)

    def tokens(self, prompts: Prompts, sampling: Sampling) -> Iterator[torch.Tensor]:
        sampling.check()
        batch = left_pad(prompts, self.pad_id, self.backend.device)
        rows, width = batch.host_ids.shape
        self.check_length(width, sampling.max_new_tokens)
        self.backend.reset(rows, width + sampling.max_new_tokens)
        table = None
        if not sampling.plain_greedy:
            # every op before the prefill delays the first token: greedy needs no table
            table = (self.backend.sampling_table() if self.backend.fused_sampling
                     else SamplingTable.new(rows, self.backend.vocab_size, self.backend.device))
            table.fill(list(range(rows)), [(sampling, row) for row in range(rows)], prompts)
        position = batch.position_ids[:, -1:]  # each row's last prompt token's
        token = self.pick(self.backend.prefill(batch)[:, -1], table, position)
        yield from self.until_stopped(self.decode(token, position, sampling.max_new_tokens - 1, table), sampling)

    @staticmethod
    def pick(logits: torch.Tensor, table: SamplingTable | None, position: torch.Tensor) -> torch.Tensor:
        """Each row's next token from logits [B, V]: the argmax, or drawn by the table (None: plain greedy)."""
        return logits.argmax(-1) if table is None else sample(logits, table, position)

    def decode(self, token: torch.Tensor, position: torch.Tensor, count: int,
               table: SamplingTable | None) -> Iterator[torch.Tensor]:
        """token [B], the prefill's pick after position [B, 1], then `count` decode steps."""
        yield token
        if table is None and self.backend.fused_greedy:
            yield from self.backend.greedy_steps(token, position + 1, count)
            return
        if table is not None and self.backend.fused_sampling:
            yield from self.backend.sampled_steps(token, position + 1, count)
            return
        for _ in range(count):
            position = position + 1
            token = self.pick(self.backend.decode(token[:, None], position), table, position)
            yield token

    def until_stopped(self, tokens: Iterator[torch.Tensor], sampling: Sampling) -> Iterator[torch.Tensor]:
        """tokens with each row's tokens after its stop token replaced by pad_id; ends when every row has stopped."""
        if not sampling.stop_tokens:
            yield from tokens
            return
        stops = torch.tensor(sampling.stop_tokens, dtype=torch.long, device=self.backend.device)
        done = None
        for token in tokens:
            if done is not None:
                token = token.masked_fill(done, self.pad_id)
            yield token
            done = torch.isin(token, stops) if done is None else done | torch.isin(token, stops)
            if bool(done.all()):
                return

    def generate(self, prompts: Prompts, sampling: Sampling) -> list[list[int]]:
        """New tokens of each prompt, up to and including its first stop token."""
        steps = [t.cpu() for t in self.stream(prompts, sampling)]
        out = []
        for row in torch.stack(steps, 1).tolist() if steps else [[] for _ in prompts]:
            cut = next((i + 1 for i, t in enumerate(row) if t in sampling.stop_tokens), len(row))
            out.append(row[:cut])
        return out
