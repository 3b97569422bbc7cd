"""The scorer: each token's log-probability and the top alternatives, against log-softmax written
plainly; a backend's own scoring between two steps of a generation."""

import pytest
import torch

from pipeline.runtime.scoring import MAX_TOP, Scorer, eager_logits
from pipeline.runtime.static.torch_compiled import TorchCompiledBackend
from tests.runtime.conftest import PROMPTS, scored_between_steps


def test_scores_are_the_log_softmax_of_the_logits_before_each_token(model):
    scorer = Scorer(eager_logits(model, torch.device("cpu")))
    scores = scorer.score(PROMPTS, [1, 2, 3], top=4)
    for seq, start, s in zip(PROMPTS, [1, 2, 3], scores):
        with torch.no_grad():
            logprobs = torch.log_softmax(model(torch.tensor([seq])).logits[0], -1)
        assert s.token_logprobs == pytest.approx([logprobs[t - 1, seq[t]].item() for t in range(start, len(seq))], abs=1e-5)
        for t, alternatives in zip(range(start, len(seq)), s.top):
            best = logprobs[t - 1].topk(4)
            assert [i for i, _ in alternatives] == best.indices.tolist()
            assert [v for _, v in alternatives] == pytest.approx(best.values.tolist(), abs=1e-5)


def test_a_whole_sequence_scored_from_its_end_is_empty_and_bad_arguments_are_refused(model):
    scorer = Scorer(eager_logits(model, torch.device("cpu")))
    assert scorer.score([[5, 6]], [2], top=0)[0].token_logprobs == []
    with pytest.raises(ValueError, match="start is 0"):
        scorer.score([[5, 6]], [0], top=1)
    with pytest.raises(ValueError, match=f"ask for 0 to {MAX_TOP}"):
        scorer.score([[5, 6]], [1], top=MAX_TOP + 1)


def test_the_static_backend_scores_on_its_own_prefill_and_leaves_the_generation_alone(model):
    """A sequence longer than the generation's cache: the scoring cache is one of its own."""
    backend = TorchCompiledBackend(model, "fp32", "cpu", compile=False)
    assert backend.own_scoring
    sequence = [(7 * i) % model.config.vocab_size for i in range(1, 60)]
    scored_between_steps(backend, eager_logits(model, torch.device("cpu")), PROMPTS, sequence)
