"""Choosing the next token: greedy, or sampled with temperature, top-k, top-p and a repetition
penalty, reproducible under a seed."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from pipeline.errors import UserError


@dataclass
class Sampling:
    max_new_tokens: int = 32
    do_sample: bool = False  # False: greedy (argmax); the other knobs but repetition_penalty are ignored
    temperature: float = 1.0
    top_k: int = 0  # 0 = no top-k filter
    top_p: float = 1.0  # nucleus: keep the smallest set of tokens whose probability reaches top_p
    repetition_penalty: float = 1.0  # > 1 discourages tokens already in the sequence (CTRL's rule)
    seed: int | None = None
    stop_tokens: tuple[int, ...] = ()

    def check(self) -> None:
        """Reject settings that would fail or silently misbehave, naming the option (NaN passes every
        comparison as false, so each range is written to admit only what it names)."""
        if self.max_new_tokens < 1:
            raise UserError(f"--max-new-tokens {self.max_new_tokens}: must be at least 1")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise UserError(f"--temperature {self.temperature}: must be a finite number >= 0")
        if self.do_sample and not self.temperature > 0:
            raise UserError(f"--temperature {self.temperature}: must be > 0 when sampling (use greedy decoding instead)")
        if not 0 < self.top_p <= 1:
            raise UserError(f"--top-p {self.top_p}: must be in (0, 1]")
        if self.top_k < 0:
            raise UserError(f"--top-k {self.top_k}: must be 0 (off) or positive")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise UserError(f"--repetition-penalty {self.repetition_penalty}: must be a finite number > 0 (1 = off)")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise UserError(f"--seed {self.seed}: must be in [0, 2^63)")


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """logits [B, V]; seen [B, T] token ids. Positive logits are divided, negative multiplied."""
    picked = logits.gather(1, seen)
    return logits.scatter(1, seen, torch.where(picked > 0, picked / penalty, picked * penalty))


def filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop = cumulative - sorted_logits.softmax(-1) >= top_p  # keep the token that crosses top_p
        logits = logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    return logits


def next_tokens(logits: torch.Tensor, seen: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> torch.Tensor:
    """logits [B, V] fp32 of the last position -> next token ids [B]."""
    if sampling.repetition_penalty != 1.0:
        logits = apply_repetition_penalty(logits, seen, sampling.repetition_penalty)
    if not sampling.do_sample:
        return logits.argmax(-1)
    logits = filter_top_k_top_p(logits / sampling.temperature, sampling.top_k, sampling.top_p)
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)
