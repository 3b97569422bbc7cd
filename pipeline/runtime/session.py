"""A backend opened for generating text: the one way `generate` and serve's engine load what they run."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from pipeline.artifacts import RunDir
from pipeline.errors import UserError
from pipeline.runtime.backend import Backend, BackendUnavailable
from pipeline.runtime.generate import Generator
from pipeline.runtime.loader import open_backend
from pipeline.runtime.sampling import Sampling
from pipeline.runtime.static.static_backend import StaticCacheBackend
from pipeline.tokenizer import encode, load_tokenizer


@dataclass
class Session:
    backend: Backend
    tokenizer: object  # a transformers tokenizer of the run's checkpoint

    @property
    def eos(self) -> int:
        return self.tokenizer.eos_token_id

    def generator(self) -> Generator:
        return Generator(self.backend, self.eos)

    def encode(self, text: str, what: str = "the prompt") -> list[int]:
        return encode(self.tokenizer, text, what)

    def decode(self, tokens: list[int]) -> str:
        """Text of generated tokens, without the stop token."""
        return self.tokenizer.decode([t for t in tokens if t != self.eos])


def open_named_backend(run: RunDir, backend: str, precision: str, device: torch.device) -> Backend:
    """The backend, or a one-line error naming the options when it cannot run here."""
    try:
        return open_backend(run, backend, precision, device)
    except BackendUnavailable as e:
        raise UserError(f"--backend {backend} --precision {precision}: {e}") from None


class RowLocalRefused(UserError):
    """--deterministic asked of a backend that cannot compute its rows row-local (make_row_local)."""


def make_row_local(backend: Backend, rows: int | None) -> None:
    """--deterministic outside the server (docs/design.md, "Deterministic serving"): a static-cache backend
    computes every row as that row alone would; another computes a batch's rows in one runtime call whose
    kernels depend on the batch, so it may take one row at a time (rows 1) and is refused more."""
    if isinstance(backend, StaticCacheBackend):
        try:
            backend.make_row_local()
        except UserError as e:
            raise RowLocalRefused(str(e)) from None
    elif rows != 1:
        raise RowLocalRefused(f"--deterministic: the {backend.name} backend computes a batch's rows in one call whose "
                        "kernels depend on the batch; use triton or torch-compiled (CPU), or one prompt")


def open_session(run: RunDir, backend: str, precision: str, device: torch.device) -> Session:
    """The run's tokenizer and the backend (open_named_backend)."""
    tokenizer = load_tokenizer(run.checkpoint)
    return Session(open_named_backend(run, backend, precision, device), tokenizer)


def print_generation(session: Session, prompts: list[str], sampling: Sampling) -> None:
    """Generate from the prompts as one batch, streaming the first prompt's text as it comes and
    printing the others' once done."""
    ids = [session.encode(p, f"prompt {i + 1}") for i, p in enumerate(prompts)]
    rows: list[list[int]] = [[] for _ in ids]
    shown = ""
    steps = session.generator().stream(ids, sampling)
    first = next(steps)  # a bad request (an empty or too long prompt) fails here, before any output
    print(prompts[0], end="", flush=True)  # valid UTF-8: encode checked it
    for step in itertools.chain([first], steps):
        for row, token in zip(rows, step.tolist()):
            row.append(token)
        # decode the whole row: one token can hold half of a multi-byte character
        now = session.decode(rows[0])
        print(now[len(shown):], end="", flush=True)
        shown = now
    print()
    for prompt, row in zip(prompts[1:], rows[1:]):
        print(prompt + session.decode(row))
