"""What a request asks of the next-token choice: greedy, or sampled with temperature, top-k, top-p,
the repetition, presence and frequency penalties and a seed; every range checked here, the one place
that keeps values the device sampler (pipeline.runtime.sampler) could not compute with away from it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.errors import UserError

# a temperature below this samples as greedy (vLLM's rule): logits divided by less overflow fp32
MIN_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class Limit:
    """The values a request setting may take: a range, each end closed unless marked open, None for
    none. Written so that NaN is admitted by no range (every comparison with it is false)."""
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    note: str = ""  # what a special value means, for the message

    def admits(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def describe(self) -> str:
        def end(v: float) -> str:
            return "2^63" if v == 2**63 else f"{v:g}"
        if self.high is None:
            text = f"{'>' if self.low_open else '>='} {end(self.low)}"
        else:
            text = f"in {'(' if self.low_open else '['}{end(self.low)}, {end(self.high)}{')' if self.high_open else ']'}"
        return f"{text} ({self.note})" if self.note else text

    def bounds(self) -> dict:
        """The range as pydantic's Field keywords (ge / gt, le / lt)."""
        out = {}
        if self.low is not None:
            out["gt" if self.low_open else "ge"] = self.low
        if self.high is not None:
            out["lt" if self.high_open else "le"] = self.high
        return out


# Every front door's limits (the CLI, serve's OpenAI and native routes, the Triton model), by Sampling's
# field: one table, so that a value one refuses no other takes. Multiplicative penalties outside their
# range push fp32 logits to 0 or inf; the rest are OpenAI's ranges (top_k -1 is vLLM's "off").
LIMITS = {
    "max_new_tokens": Limit(1),
    "temperature": Limit(0, 2, note="0 = greedy"),
    "top_p": Limit(0, 1, low_open=True),
    "top_k": Limit(-1, note="-1 or 0 = off"),
    "repetition_penalty": Limit(1e-2, 1e2, note="1 = off"),
    "presence_penalty": Limit(-2, 2, note="0 = off"),
    "frequency_penalty": Limit(-2, 2, note="0 = off"),
    "seed": Limit(0, 2**63, high_open=True),
}

# the settings OpenAI's fields and Sampling's share, name for name (temperature and max_tokens differ)
OPENAI_SETTINGS = ("top_p", "top_k", "repetition_penalty", "presence_penalty", "frequency_penalty", "seed")


def refuse_out_of_range(name: str, value: float, field: str | None = None) -> None:
    """A UserError naming `name` (the option or field as the caller's user spells it) when value is
    outside LIMITS[field or name]."""
    limit = LIMITS[field or name]
    if not limit.admits(value):
        raise UserError(f"{name} {value}: must be {limit.describe()}")


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

    def __post_init__(self) -> None:
        if self.top_k == -1:  # vLLM's and the OpenAI clients' "off"
            self.top_k = 0

    @classmethod
    def from_openai(cls, max_tokens: int, temperature: float, stop_tokens: tuple[int, ...] = (), **settings) -> Sampling:
        """OpenAI's fields (temperature 0 = greedy; top_p, top_k, the penalties and seed as Sampling
        names them), as every front door that speaks them (serve's /v1, the Triton model) builds a request."""
        return cls(max_new_tokens=max_tokens, do_sample=temperature > 0, temperature=temperature or 1.0,
                   stop_tokens=stop_tokens, **settings)

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
        """Reject settings that would fail or silently misbehave, naming the option as the CLI spells it."""
        for field in LIMITS:
            value = getattr(self, field)
            if value is not None:
                refuse_out_of_range(f"--{field.replace('_', '-')}", value, field)
        if self.do_sample and not self.temperature > 0:
            raise UserError(f"--temperature {self.temperature}: must be > 0 when sampling (use greedy decoding instead)")
