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
