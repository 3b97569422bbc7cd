"""The serving batch's row table: free cache rows are reused lowest first, a greedy join writes no
sampling settings unless its row holds another's, and a compaction moves a row's settings with it."""

import pytest

from pipeline.runtime.jobs import Job
from pipeline.runtime.rows import Row, RowTable
from pipeline.runtime.sampling import Sampling
from pipeline.runtime.static.torch_compiled import TorchCompiledBackend

SAMPLED = Sampling(max_new_tokens=4, do_sample=True, temperature=0.7, top_p=0.9, seed=3)


def joined(table: RowTable, samplings: list[Sampling]) -> list[Row]:
    rows = [Row(Job([[464, 2068]], s, lambda item: None), 0, index, 0)
            for s, index in zip(samplings, table.places(len(samplings)))]
    written = table.settings_to_write(rows)
    if written:
        table.sampling.fill([r.index for r in written], [(r.job.sampling, r.prompt) for r in written],
                            [r.job.prompts[r.prompt] for r in written])
    for r in rows:
        table.place(r)
    return rows


def test_settings_are_written_only_where_a_row_needs_them_and_follow_a_moved_row(model):
    table = RowTable(TorchCompiledBackend(model, "fp32", "cpu", compile=False), max_rows=4)
    greedy, sampled, other, last = joined(table, [Sampling(), SAMPLED, Sampling(), SAMPLED])
    assert table.sampled == 2 and [r.index for r in (greedy, sampled, other, last)] == [0, 1, 2, 3]
    assert table.sampling.floats[:, 0].tolist() == pytest.approx([0.0, 0.7, 0.0, 0.7])
    assert table.plain_settings == [True, False, True, False]
    table.leave(sampled)  # row 1 free in place: four cache rows still fill the 4-row bucket
    assert table.placed[1] is None and table.sampled == 1
    (late,) = joined(table, [Sampling()])  # lands on row 1, which holds the sampled row's settings: rewritten
    assert late.index == 1 and table.sampling.floats[1, 0].item() == 0.0 and table.plain_settings[1]
    table.leave(greedy)
    table.leave(other)  # two rows left over four cache rows: the last moves into the lowest free one
    assert table.placed == [last, late] and last.index == 0
    assert table.sampling.floats[0].tolist() == pytest.approx([0.7, 0.9, 1.0, 0.0, 0.0])
    assert table.sampling.ints[0, 1].item() == 3 and not table.plain_settings[0]


def test_free_rows_are_reused_lowest_first(model):
    """Five rows, the fourth leaves: four fit the 4-row bucket, so the fifth moves into its place; the
    second leaves: its row stays free in place and is the first a join takes."""
    table = RowTable(TorchCompiledBackend(model, "fp32", "cpu", compile=False), max_rows=8)
    rows = joined(table, [Sampling()] * 5)
    table.leave(rows[3])
    assert rows[4].index == 3
    table.leave(rows[1])
    assert table.places(3) == [1, 4, 5]
