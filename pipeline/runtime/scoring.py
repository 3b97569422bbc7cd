"""Log-probabilities of given tokens under the model (OpenAI's `logprobs` and `echo`, and scoring
requests: echo with max_tokens 0), from one forward over each whole sequence rather than from the
batched decode, which keeps no per-token distribution (docs/design.md, "Log-probabilities"). The
forward is the engine's own prefill where its backend has one that leaves the generation in flight
alone (Backend.own_scoring), else eager PyTorch on a copy of the checkpoint. The values are the
model's own (log-softmax of its logits), before temperature, penalties or filtering, as OpenAI and
vLLM report them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

MAX_TOP = 20  # the most alternatives per position a request may ask for (vLLM's default cap)

Logits = Callable[[torch.Tensor], torch.Tensor]  # one sequence's ids [S] on the host -> its logits [S, V] at every position


@dataclass(frozen=True)
class Scores:
    """One sequence's scored positions, from `start` on: each token's log-probability given the tokens
    before it, and the `top` most likely tokens there with theirs (largest first)."""
    token_logprobs: list[float]
    top: list[list[tuple[int, float]]]


def eager_logits(model, device: torch.device, dtype: torch.dtype = torch.float32) -> Logits:
    """The checkpoint's model in eager PyTorch, in the served precision's float type (fp32 on a CPU):
    the forward of a backend that has no scoring of its own."""
    model = model.to(device=device, dtype=dtype).eval()
    return lambda ids: model(input_ids=ids[None].to(device)).logits[0]


class Scorer:
    """Sequences scored by `logits`, on the device its logits come on."""

    def __init__(self, logits: Logits):
        self.logits = logits

    @torch.inference_mode()
    def score(self, sequences: list[list[int]], starts: list[int], top: int) -> list[Scores]:
        """sequences[i]'s positions from starts[i] (>= 1: the first token has nothing before it) to its
        end. One forward per sequence: a batch's fp32 log-softmax over the vocabulary would take
        200 MB per 1,000 positions per sequence at once."""
        if not 0 <= top <= MAX_TOP:
            raise ValueError(f"top is {top}: ask for 0 to {MAX_TOP} alternatives")
        for seq, start in zip(sequences, starts):
            if not 1 <= start <= len(seq):
                raise ValueError(f"start is {start}: score positions 1 to {len(seq)} of a {len(seq)}-token sequence")
        return [self.score_one(seq, start, top) if start < len(seq) else Scores([], [])
                for seq, start in zip(sequences, starts)]

    def score_one(self, seq: list[int], start: int, top: int) -> Scores:
        ids = torch.tensor(seq)
        logits = self.logits(ids)[start - 1:len(seq) - 1]  # position t predicts token t + 1
        ids = ids.to(logits.device)
        logprobs = torch.log_softmax(logits.float(), dim=-1)  # fp32: fp16 would lose the small ones
        chosen = logprobs.gather(1, ids[start:, None])[:, 0]
        values, tokens = logprobs.topk(top, dim=-1)
        return Scores(chosen.tolist(), [list(zip(t, v)) for t, v in zip(tokens.tolist(), values.tolist())])
