"""What a request may ask of the next-token choice: every value the sampler could not compute with
is refused here, naming the option."""

import pytest

from pipeline.errors import UserError
from pipeline.runtime.sampling import Sampling


@pytest.mark.parametrize("settings, message", [
    (dict(temperature=float("inf")), "--temperature inf: must be a finite number"),
    (dict(temperature=float("nan"), do_sample=True), "--temperature nan: must be a finite number"),
    (dict(repetition_penalty=float("nan")), r"--repetition-penalty nan: must be in \[0.01, 100\]"),
    (dict(repetition_penalty=1e-320), r"--repetition-penalty 1e-320: must be in \[0.01, 100\]"),
    (dict(repetition_penalty=1e308), r"--repetition-penalty 1e\+308: must be in"),
    (dict(presence_penalty=2.5), r"--presence-penalty 2.5: must be in \[-2, 2\]"),
    (dict(frequency_penalty=float("-inf")), r"--frequency-penalty -inf: must be in \[-2, 2\]"),
    (dict(top_p=float("nan")), "--top-p nan: must be in"),
    (dict(top_p=0.0), r"--top-p 0.0: must be in \(0, 1\]"),
    (dict(top_k=-1), "--top-k -1: must be 0"),
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
