"""open_session: what generate and serve load, or one line naming the options that cannot run."""

import pytest
import torch

from pipeline.errors import UserError
from pipeline.runtime.sampling import Sampling
from pipeline.runtime.session import open_session


def test_a_session_generates_and_decodes_without_the_stop_token(exported_run):
    _, run, _ = exported_run
    session = open_session(run, "ort", "fp32", torch.device("cpu"))
    tokens = session.generator().generate([session.encode("The module")], Sampling(max_new_tokens=4))[0]
    assert len(tokens) == 4 and session.decode(tokens + [session.eos]) == session.decode(tokens)


def test_a_backend_that_cannot_run_is_one_line_naming_the_options(exported_run):
    _, run, _ = exported_run
    with pytest.raises(UserError, match=r"^--backend triton --precision fp16: triton runs on a CUDA GPU"):
        open_session(run, "triton", "fp16", torch.device("cpu"))
