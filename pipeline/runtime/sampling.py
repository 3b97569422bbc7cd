"""What a request asks of the next-token choice: greedy, or sampled with temperature, top-k, top-p,
the repetition, presence and frequency penalties and a seed; every range checked here, the one place
that keeps values the device sampler (pipeline.runtime.sampler) could not compute with away from it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.errors import UserError

# a temperature below this samples as greedy (vLLM's rule): logits divided by less overflow fp32
MIN_TEMPERATURE = 1e-5
# multiplicative penalties outside this range push fp32 logits to 0 or inf
REPETITION_RANGE = (1e-2, 1e2)
ADDITIVE_PENALTY_LIMIT = 2.0  # presence and frequency penalties, OpenAI's range [-2, 2]


@dataclass
class Sampling:
    max_new_tokens: int = 32
    do_sample: bool = False  # False: greedy (argmax); temperature, top-k and top-p are ignored
    temperature: float = 1.0
    top_k: int = 0  # 0 = no top-k filter
    top_p: float = 1.0  # nucleus: keep the smallest set of tokens whose probability reaches top_p
    repetition_penalty: float = 1.0  # > 1 discourages tokens of the prompt and the output (CTRL's rule)
    presence_penalty: float = 0.0  # subtracted from the logit of every token the output holds (OpenAI's)
    frequency_penalty: float = 0.0  # subtracted once per time the output holds the token (OpenAI's)
    seed: int | None = None
    stop_tokens: tuple[int, ...] = ()

    @property
    def greedy(self) -> bool:
        """Whether the token is the argmax of the (penalised) logits."""
        return not self.do_sample or self.temperature < MIN_TEMPERATURE

    @property
    def penalized(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def plain_greedy(self) -> bool:
        """Greedy without penalties: the backends' fused argmax picks it."""
        return self.greedy and not self.penalized

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
        low, high = REPETITION_RANGE
        if not low <= self.repetition_penalty <= high:
            raise UserError(f"--repetition-penalty {self.repetition_penalty}: must be in [{low:g}, {high:g}] (1 = off)")
        for option, value in (("presence-penalty", self.presence_penalty), ("frequency-penalty", self.frequency_penalty)):
            if not -ADDITIVE_PENALTY_LIMIT <= value <= ADDITIVE_PENALTY_LIMIT:
                raise UserError(f"--{option} {value}: must be in [-2, 2] (0 = off)")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise UserError(f"--seed {self.seed}: must be in [0, 2^63)")
