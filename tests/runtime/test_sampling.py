"""Choosing the next token: top-k, top-p, the repetition penalty, seeded sampling."""

import pytest
import torch

from pipeline.errors import UserError
from pipeline.runtime.sampling import (
    Sampling,
    apply_repetition_penalty,
    filter_top_k_top_p,
    next_tokens,
)


def test_top_k_and_top_p_keep_the_right_tokens():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0]])
    assert torch.isinf(filter_top_k_top_p(logits, 2, 1.0)).tolist() == [[False, False, True, True]]
    # probabilities ~ [0.64, 0.24, 0.09, 0.03]: top_p 0.7 keeps the two that first reach 0.7
    assert torch.isinf(filter_top_k_top_p(logits, 0, 0.7)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_top_k_top_p(logits, 0, 0.5)).tolist() == [[False, True, True, True]]


def test_repetition_penalty_follows_ctrl():
    out = apply_repetition_penalty(torch.tensor([[2.0, -2.0, 1.0]]), torch.tensor([[0, 1]]), 2.0)
    assert out.tolist() == [[1.0, -4.0, 1.0]]


def test_seeded_sampling_is_reproducible():
    logits = torch.randn(4, 100)
    s = Sampling(do_sample=True, temperature=0.9, top_k=20, top_p=0.9, seed=7)
    draws = [next_tokens(logits, torch.zeros(4, 1, dtype=torch.long), s, torch.Generator().manual_seed(7)) for _ in range(2)]
    assert torch.equal(*draws)


@pytest.mark.parametrize("settings, message", [
    (dict(temperature=float("inf")), "--temperature inf: must be a finite number"),
    (dict(temperature=float("nan"), do_sample=True), "--temperature nan: must be a finite number"),
    (dict(repetition_penalty=float("nan")), "--repetition-penalty nan: must be a finite number > 0"),
    (dict(top_p=float("nan")), "--top-p nan: must be in"),
    (dict(seed=2**64), r"--seed 18446744073709551616: must be in \[0, 2\^63\)"),
])
def test_numbers_that_are_not_sane_are_refused_by_option(settings, message):
    with pytest.raises(UserError, match=message):
        Sampling(**settings).check()
