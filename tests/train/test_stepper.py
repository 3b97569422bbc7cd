"""The training state's memory check: what a fine-tune refuses before building a model it cannot train."""

from pipeline.machine import gpt2_parameters
from pipeline.train.stepper import training_state_error

XL = gpt2_parameters(48, 1600, 50257, 1024)
GIB = 2**30


def test_a_state_past_the_free_memory_is_one_line_naming_the_option_and_the_figures():
    error = training_state_error(XL, 22 * GIB, shards=1, resident=False, device="cpu")
    assert error.startswith("train.device=cpu: the training state of 1,558M parameters")
    assert "needs 23.2 GiB and 22.0 GiB is free there" in error and "\n" not in error
    assert "train.parallel=fsdp" in error and "--preset" in error


def test_weights_already_loaded_and_shards_count_and_an_unknown_free_memory_refuses_nothing():
    assert training_state_error(XL, 22 * GIB, shards=2, resident=False, device="cpu") is None  # 11.6 GiB a rank
    assert training_state_error(XL, 18 * GIB, shards=1, resident=True, device="cpu") is None  # 17.4 GiB beyond them
    assert "beyond its loaded weights" in training_state_error(XL, 17 * GIB, shards=1, resident=True, device="cpu")
    assert training_state_error(XL, None, shards=1, resident=False, device="cuda") is None
