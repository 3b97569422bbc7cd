"""The generator's rules: sampling settings, empty prompts, the context limit, stop tokens, and
torch's threads around a backend with a thread pool of its own."""

import pytest
import torch

from pipeline.errors import UserError
from pipeline.runtime.dynamic.torch_eager import TorchEagerBackend
from pipeline.runtime.generate import Generator
from pipeline.runtime.sampling import Sampling
from tests.runtime.conftest import PROMPTS


@pytest.mark.parametrize("settings, message", [
    (dict(do_sample=True, temperature=0.0), "--temperature 0.0: must be > 0"),
    (dict(top_p=0.0), "--top-p 0.0: must be in"),
    (dict(top_p=1.5), "--top-p 1.5"),
    (dict(max_new_tokens=0), "--max-new-tokens 0"),
])
def test_bad_sampling_settings(model, settings, message):
    with pytest.raises(UserError, match=message):
        next(Generator(TorchEagerBackend(model)).stream(PROMPTS, Sampling(**settings)))


def test_empty_prompt_and_context_limit(model):
    gen = Generator(TorchEagerBackend(model))
    with pytest.raises(UserError, match="prompt 1 is empty"):
        gen.generate([[1, 2], []], Sampling())
    with pytest.raises(UserError, match="a prompt of 60 tokens plus max_new_tokens=10 exceeds the model's context of 64"):
        gen.generate([[1] * 60], Sampling(max_new_tokens=10))


def test_stop_tokens_end_rows_and_streaming_yields_each_step(model):
    gen = Generator(TorchEagerBackend(model))
    free = gen.generate(PROMPTS, Sampling(max_new_tokens=8))
    stop = free[0][2]
    stopped = gen.generate(PROMPTS, Sampling(max_new_tokens=8, stop_tokens=(stop,)))
    assert stopped[0] == free[0][:free[0].index(stop) + 1]
    steps = list(gen.stream(PROMPTS, Sampling(max_new_tokens=5)))
    assert len(steps) == 5 and all(s.shape == (3,) for s in steps)


def test_torch_takes_one_thread_while_onnx_runtime_generates_on_the_cpu(exported_run):
    """ONNX Runtime's thread pool has the cores while it generates: the torch ops around its steps run
    on one thread, and torch's own setting is back afterwards; a torch backend leaves it as it is."""
    from pipeline.model import load_checkpoint
    from pipeline.runtime.loader import open_backend

    _, run, _ = exported_run
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen = {}
        for backend in (open_backend(run, "ort", "fp32", torch.device("cpu")), TorchEagerBackend(load_checkpoint(run.checkpoint))):
            seen[backend.name] = {torch.get_num_threads() for _ in Generator(backend).stream([[464, 2068]], Sampling(max_new_tokens=3))}
            assert torch.get_num_threads() == 2
        assert seen == {"ort": {1}, "torch": {2}}
    finally:
        torch.set_num_threads(before)
