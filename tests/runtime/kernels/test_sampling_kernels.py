"""The device sampler's Triton kernel (compiled on a GPU; on a CPU run by Triton's interpreter, which
conftest selects) against the torch sampler it must equal on the same device: the same tokens and the
same counts, greedy, sampled, filtered, penalised and through a join's row map."""

import dataclasses

import pytest
import torch

from pipeline.runtime.sampler import sample_reference
from pipeline.runtime.sampling import Sampling
from pipeline.runtime.sampling_table import BLOCK, SamplingTable

pytest.importorskip("triton")
from pipeline.runtime.kernels.sampling_kernels import sample_rows  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

VOCAB = 2 * BLOCK + 77  # three blocks, the last one partial
SETTINGS = [
    Sampling(),
    Sampling(do_sample=True, temperature=0.8, top_p=0.95, seed=1),
    Sampling(do_sample=True, temperature=1.0, top_k=5, seed=2),
    Sampling(do_sample=True, temperature=0.7, top_k=50, top_p=0.5, repetition_penalty=1.3, presence_penalty=0.5,
             frequency_penalty=0.3, seed=3),
    Sampling(repetition_penalty=1.5),
    Sampling(do_sample=True, temperature=1.2, seed=9),
    Sampling(do_sample=True, temperature=0.05, top_k=3, top_p=0.3, seed=2**62 + 5),
]


def tables() -> tuple[SamplingTable, SamplingTable]:
    table = SamplingTable.new(len(SETTINGS), VOCAB, DEVICE)
    table.fill(list(range(len(SETTINGS))), [(s, i % 2) for i, s in enumerate(SETTINGS)],
               [[1, 2, 3, VOCAB - 1]] * len(SETTINGS))
    return table, SamplingTable(*(t.clone() for t in dataclasses.astuple(table)))


def test_the_kernel_draws_what_the_torch_sampler_draws():
    torch.manual_seed(0)
    reference, kernel = tables()
    for step in range(3):  # the counts of penalised rows carry from step to step
        logits = torch.randn(len(SETTINGS), VOCAB, device=DEVICE) * 3
        positions = torch.arange(len(SETTINGS), device=DEVICE) + 10 * step
        want = sample_reference(logits, reference, positions)
        assert sample_rows(logits, kernel, positions).tolist() == want.tolist()
        assert torch.equal(kernel.counts, reference.counts)


def test_the_kernel_reads_table_rows_through_a_row_map_and_strided_logits():
    torch.manual_seed(1)
    reference, kernel = tables()
    wide = torch.randn(3, 2, VOCAB, device=DEVICE)  # a prefill's [rows, seq, V]: each row's last position
    logits = wide[:, -1]
    rows, positions = torch.tensor([5, 3, 1], device=DEVICE), torch.tensor([4, 8, 15], device=DEVICE)
    want = sample_reference(logits, reference, positions, rows)
    assert sample_rows(logits, kernel, positions, rows).tolist() == want.tolist()
