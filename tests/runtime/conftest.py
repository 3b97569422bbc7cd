"""What the runtime's tests share: a small random GPT-2 and prompts of different lengths."""

import pytest

from pipeline.config import load_config
from pipeline.model import new_model


@pytest.fixture(scope="module")
def model():
    cfg = load_config("tiny", overrides=["model.n_layer=2", "model.n_embd=64", "model.n_head=4", "model.n_positions=64",
                                         "data.block_size=32", "data.calib_block_size=32", "engine.max_len=64",
                                         "engine.opt_len=32", "engine.max_seq=32", "validate.prompt_tokens=16"])
    return new_model(cfg.model, seed=0).eval()


PROMPTS = [[464, 2068, 7586, 21831, 18045, 625], [15496, 995], [818, 262, 3726]]


def scored_between_steps(backend, reference, prompts: list[list[int]], sequence: list[int]) -> None:
    """A backend's own scoring (Backend.sequence_logits), asked between two steps of a generation in
    flight, scores `sequence` as `reference` (a model's logits of one sequence) does, and the generation
    then goes on with the tokens it gives undisturbed."""
    import torch

    from pipeline.runtime.generate import Generator
    from pipeline.runtime.sampling import Sampling
    from pipeline.runtime.scoring import Scorer

    s = Sampling(max_new_tokens=6)
    undisturbed = [t.clone() for t in Generator(backend, pad_id=0).stream(prompts, s)]
    scores, tokens = None, []
    for step, token in enumerate(Generator(backend, pad_id=0).stream(prompts, s)):
        tokens.append(token.clone())
        if step == 2:
            scores = Scorer(backend.sequence_logits).score([sequence], [1], top=3)[0]
    assert torch.equal(torch.stack(tokens), torch.stack(undisturbed))
    expected = Scorer(reference).score([sequence], [1], top=3)[0]
    assert scores.token_logprobs == pytest.approx(expected.token_logprobs, abs=1e-4)
    assert [[t for t, _ in top] for top in scores.top] == [[t for t, _ in top] for top in expected.top]
