"""The device sampler, in torch on the CPU: drawn frequencies against the exact top-k / top-p /
temperature distribution (chi-square), penalties against a plain reference, greedy identical to
argmax, Philox against its published answers, and a seeded row's draws independent of its batch."""

import math

import numpy as np
import pytest
import torch

from pipeline.runtime import sampler
from pipeline.runtime.sampler import philox, sample, uniform
from pipeline.runtime.sampling import Sampling
from pipeline.runtime.sampling_table import SamplingTable

DRAWS = 20000


def table_of(settings: list[Sampling], prompts: list[list[int]], vocab: int) -> SamplingTable:
    table = SamplingTable.new(len(settings), vocab, torch.device("cpu"))
    table.fill(list(range(len(settings))), [(s, 0) for s in settings], prompts)
    return table


def exact(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """The distribution the sampler must draw from, by sorting: softmax at the temperature, kept only
    where fewer than top_k tokens are likelier and their mass is below top_p."""
    p = torch.softmax(logits.double() / s.temperature, -1)
    keep = torch.ones_like(p, dtype=torch.bool)
    for i in range(len(p)):
        above = p > p[i]
        keep[i] = (s.top_k == 0 or int(above.sum()) < s.top_k) and float(p[above].sum()) < s.top_p
    q = torch.where(keep, p, 0.0)
    return q / q.sum()


def chi_square_bound(dof: int, z: float = 4.26) -> float:
    """The chi-square value a correct sampler exceeds with probability about 1e-5 (Wilson-Hilferty)."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def draw_many(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """DRAWS tokens for one row's logits, each at its own position: one batched call."""
    table = table_of([s] * DRAWS, [[0]] * DRAWS, len(logits))
    return sample(logits.expand(DRAWS, -1).contiguous(), table, torch.arange(DRAWS))


LOGITS = torch.tensor([2.0, 1.5, 1.2, 1.0, 0.7, 0.5, 0.3, 0.0, -0.4, -1.0, -2.0, -3.0])


@pytest.mark.parametrize("s", [
    Sampling(do_sample=True, temperature=1.0, seed=1),
    Sampling(do_sample=True, temperature=0.6, seed=2),
    Sampling(do_sample=True, temperature=1.3, top_k=5, seed=3),
    Sampling(do_sample=True, temperature=0.8, top_p=0.7, seed=4),
    Sampling(do_sample=True, temperature=1.0, top_k=8, top_p=0.9, seed=5),
    Sampling(do_sample=True, temperature=2.0, top_k=1, seed=6),
], ids=["t1", "t0.6", "top_k5", "top_p0.7", "top_k8_top_p0.9", "top_k1"])
def test_draws_follow_the_exact_distribution(s):
    want = exact(LOGITS, s)
    counts = torch.bincount(draw_many(LOGITS, s), minlength=len(LOGITS)).double()
    assert counts[want == 0].sum() == 0, "drew a token outside the top-k / top-p set"
    kept = want > 0
    expected = want[kept] * DRAWS
    chi2 = float(((counts[kept] - expected) ** 2 / expected).sum())
    dof = int(kept.sum()) - 1
    if dof:
        assert chi2 < chi_square_bound(dof), (chi2, counts.tolist(), expected.tolist())


def plain_penalties(logits: list[float], prompt: list[int], output: list[int], s: Sampling) -> list[float]:
    """The penalties written out one token at a time: CTRL's repetition penalty over prompt and output,
    then OpenAI's frequency and presence penalties over the output."""
    out = []
    for token, value in enumerate(logits):
        if token in prompt or token in output:
            value = value / s.repetition_penalty if value > 0 else value * s.repetition_penalty
        count = output.count(token)
        value -= s.frequency_penalty * count + s.presence_penalty * (count > 0)
        out.append(value)
    return out


def test_penalties_match_a_plain_reference_and_count_the_output():
    torch.manual_seed(0)
    s = Sampling(repetition_penalty=1.7, presence_penalty=0.6, frequency_penalty=0.45)
    prompt, vocab, output = [1, 4, 4, 9], 16, []
    table = table_of([s], [prompt], vocab)
    for step in range(12):
        logits = torch.randn(vocab) * 2
        want = torch.tensor(plain_penalties(logits.tolist(), prompt, output, s)).argmax().item()
        got = sample(logits[None], table, torch.tensor([step])).item()
        assert got == want
        output.append(got)
    assert table.counts[0].tolist() == [output.count(t) for t in range(vocab)]


def test_penalised_sampling_draws_from_the_penalised_distribution():
    s = Sampling(do_sample=True, temperature=0.9, repetition_penalty=1.5, presence_penalty=0.8, seed=11)
    prompt = [0, 3]
    logits = LOGITS
    penalised = torch.tensor(plain_penalties(logits.tolist(), prompt, [], s))
    table = table_of([s] * DRAWS, [prompt] * DRAWS, len(logits))
    counts = torch.bincount(sample(logits.expand(DRAWS, -1).contiguous(), table, torch.arange(DRAWS)),
                            minlength=len(logits)).double()
    expected = torch.softmax(penalised.double() / s.temperature, -1) * DRAWS
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < chi_square_bound(len(logits) - 1)


def test_greedy_is_argmax_to_the_bit_even_beside_sampled_rows():
    torch.manual_seed(1)
    logits = torch.randn(6, 50257)
    logits[2, 100] = logits[2, 7] = logits[2].max() + 1  # a tie: the first column, as torch.argmax
    settings = [Sampling(), Sampling(do_sample=True, temperature=0.7, top_p=0.9, seed=1)] * 3
    tokens = sample(logits, table_of(settings, [[0]] * 6, 50257), torch.zeros(6, dtype=torch.long))
    assert tokens[0::2].tolist() == logits[0::2].argmax(-1).tolist()
    assert tokens[2].item() == 7


def test_philox_gives_its_published_answers():
    """Random123's known-answer vectors for Philox4x32-10 (first output word)."""
    t = lambda v: np.array([v], dtype=np.uint64)  # noqa: E731
    m = 0xFFFFFFFF
    assert philox((t(0), t(0)), (t(0), t(0), t(0), t(0))).item() == 0x6627E8D5
    assert philox((t(m), t(m)), (t(m), t(m), t(m), t(m))).item() == 0x408F276D
    assert philox((t(0xA4093822), t(0x299F31D0)),
                  (t(0x243F6A88), t(0x85A308D3), t(0x13198A2E), t(0x03707344))).item() == 0xD16CFE09


def test_uniform_numbers_lie_strictly_inside_zero_and_one():
    u = uniform(torch.arange(4096), torch.arange(4096) * 7, torch.zeros(4096, dtype=torch.long), 0)
    assert 0 < u.min() and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.02


def test_a_seeded_row_draws_the_same_alone_and_in_any_batch():
    torch.manual_seed(2)
    s = Sampling(do_sample=True, temperature=1.0, top_p=0.95, seed=1234)
    row = torch.randn(1000)
    alone = sample(row[None], table_of([s], [[0]], 1000), torch.tensor([41])).item()
    others = [Sampling(do_sample=True, temperature=0.5, seed=k) for k in range(5)] + [Sampling()]
    for place in range(len(others) + 1):
        settings = others[:place] + [s] + others[place:]
        logits = torch.randn(len(settings), 1000)
        logits[place] = row
        positions = torch.randint(0, 100, (len(settings),))
        positions[place] = 41
        assert sample(logits, table_of(settings, [[0]] * len(settings), 1000), positions)[place].item() == alone


def test_rows_map_logits_to_table_rows_and_write_into_out():
    """A join's pick: logits row i by table row rows[i], into a given tensor."""
    torch.manual_seed(3)
    settings = [Sampling(), Sampling(do_sample=True, temperature=0.8, seed=9), Sampling(do_sample=True, seed=3)]
    table = table_of(settings, [[0]] * 3, 300)
    logits, positions = torch.randn(2, 300), torch.tensor([5, 6])
    out = torch.empty(2, dtype=torch.long)
    got = sample(logits, table, positions, rows=torch.tensor([2, 1]), out=out)
    assert got is out
    direct = table_of([settings[2], settings[1]], [[0]] * 2, 300)
    assert out.tolist() == sample(logits, direct, positions).tolist()


def test_a_row_no_round_accepts_takes_its_argmax_as_the_kernel_does(monkeypatch):
    monkeypatch.setattr(sampler, "ROUNDS", 1)  # the first draw, nearly always below the argmax, is the only one
    logits = torch.zeros(64, 1000)
    logits[:, 500] = 0.01
    table = table_of([Sampling(do_sample=True, temperature=1.0, top_k=1, seed=7)] * 64, [[0]] * 64, 1000)
    assert sample(logits, table, torch.arange(64)).tolist() == [500] * 64
