"""What a request may ask of the next-token choice: every value the sampler could not compute with
is refused here, naming the option."""

import pytest

from pipeline.errors import UserError
from pipeline.runtime.sampling import LIMITS, Sampling
from tests.limits import values_past_the_limits


@pytest.mark.parametrize("settings, message", [
    (dict(temperature=float("inf")), r"--temperature inf: must be in \[0, 2\]"),
    (dict(temperature=float("nan"), do_sample=True), r"--temperature nan: must be in \[0, 2\]"),
    (dict(temperature=2.5, do_sample=True), r"--temperature 2.5: must be in \[0, 2\]"),
    (dict(max_new_tokens=0), "--max-new-tokens 0: must be >= 1"),
    (dict(repetition_penalty=float("nan")), r"--repetition-penalty nan: must be in \[0.01, 100\]"),
    (dict(repetition_penalty=1e-320), r"--repetition-penalty 1e-320: must be in \[0.01, 100\]"),
    (dict(repetition_penalty=1e308), r"--repetition-penalty 1e\+308: must be in"),
    (dict(presence_penalty=2.5), r"--presence-penalty 2.5: must be in \[-2, 2\]"),
    (dict(frequency_penalty=float("-inf")), r"--frequency-penalty -inf: must be in \[-2, 2\]"),
    (dict(top_p=float("nan")), "--top-p nan: must be in"),
    (dict(top_p=0.0), r"--top-p 0.0: must be in \(0, 1\]"),
    (dict(top_k=-2), r"--top-k -2: must be >= -1 \(-1 or 0 = off\)"),
    (dict(seed=2**64), r"--seed 18446744073709551616: must be in \[0, 2\^63\)"),
])
def test_numbers_that_are_not_sane_are_refused_by_option(settings, message):
    with pytest.raises(UserError, match=message):
        Sampling(**settings).check()


@pytest.mark.parametrize("temperature", [1e-38, 5e-324, 9e-6])
def test_a_temperature_too_small_to_divide_by_samples_as_greedy(temperature):
    s = Sampling(do_sample=True, temperature=temperature)
    s.check()
    assert s.greedy and s.plain_greedy


def test_penalties_make_a_row_need_the_sampler_even_when_greedy():
    assert not Sampling(repetition_penalty=1.2).plain_greedy
    assert not Sampling(presence_penalty=0.5).plain_greedy
    assert Sampling(temperature=0.5).plain_greedy  # do_sample off: temperature is ignored


def test_top_k_minus_one_is_off_as_vllm_and_the_openai_clients_send_it():
    assert Sampling(top_k=-1).top_k == 0


@pytest.mark.parametrize("field, limit", LIMITS.items())
def test_each_limit_admits_its_ends_and_refuses_just_past_them(field, limit):
    for end, is_open, outward in ((limit.low, limit.low_open, -1), (limit.high, limit.high_open, 1)):
        if end is None:
            continue
        assert limit.admits(end) != is_open, f"{field}: {end}"
        assert not limit.admits(end + outward * max(abs(end), 1) * 1e-3), f"{field}: just past {end}"
    assert not limit.admits(float("nan"))


def test_openai_fields_build_greedy_at_temperature_zero_and_sampled_above():
    greedy, sampled = Sampling.from_openai(8, 0.0), Sampling.from_openai(8, 0.7, top_k=-1, seed=3)
    assert greedy.greedy and greedy.temperature == 1.0
    assert not sampled.greedy and (sampled.temperature, sampled.top_k, sampled.seed) == (0.7, 0, 3)


@pytest.mark.parametrize("field, value", values_past_the_limits())
def test_the_cli_refuses_every_value_past_the_limits_every_front_door_refuses(field, value):
    """The same values as tests/serve/test_app.py and tests/tritonserver/test_repository.py send."""
    with pytest.raises(UserError, match=f"--{field.replace('_', '-')} "):
        Sampling(**{field: value}).check()
