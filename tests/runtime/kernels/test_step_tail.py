"""The greedy step's tail (step_tail.greedy_advance), run by Triton's interpreter on the CPU."""

import pytest
import torch

pytest.importorskip("triton")

if torch.cuda.is_available():  # conftest chose the interpreter only where there is no GPU
    pytest.skip("these check the kernels in Triton's interpreter, on a CPU-only machine", allow_module_level=True)


@pytest.mark.parametrize("block_m", [1, 16])
def test_greedy_advance_takes_the_first_largest_column_and_moves_the_inputs_on(block_m):
    """The LM head's per-program maxima reduce to torch.argmax (first column on ties, across programs);
    the token, its column of the output, the position, the slot mask, start and step all advance, and
    the next step's input embedding is written; a row whose advance is 0 (a free row of the serving
    scheduler) keeps its position."""
    from pipeline.runtime.kernels.linear_kernels import fused_linear
    from pipeline.runtime.kernels.step_tail import greedy_advance
    from pipeline.runtime.kernels.tiles import LinearConfig
    torch.manual_seed(5)
    x, w = torch.randn(3, 32), torch.randn(100, 32)
    x[0] = 1.0
    w[10] = w[70] = 1.0  # row 0: a tie between columns 10 and 70, seven programs apart
    logits, best, best_index = torch.empty(3, 100), torch.empty(3, 7), torch.empty(3, 7, dtype=torch.int32)
    fused_linear(x, w, logits, argmax=(best, best_index), config=LinearConfig(block_m, 16, 32))
    # a greedy step's head leaves only the maxima: the same ones, and nothing written elsewhere
    maxima, weights = (best.clone(), best_index.clone()), w.clone()
    fused_linear(x, w, None, argmax=(best, best_index), config=LinearConfig(block_m, 16, 32))
    assert torch.equal(best, maxima[0]) and torch.equal(best_index, maxima[1]) and torch.equal(w, weights)
    with pytest.raises(ValueError, match="out is None"):
        fused_linear(x, w, None)
    token, position = torch.zeros(3, 1, dtype=torch.long), torch.tensor([[4], [2], [7]])
    tokens = torch.zeros(4, 3, dtype=torch.long).t()  # [rows, steps], each step's column contiguous (new_slot)
    advance = torch.tensor([[1], [0], [1]])
    step, start = torch.tensor([2]), torch.tensor(5)
    slot_mask, arrivals = torch.zeros(3, 8, dtype=torch.bool), torch.zeros(1, dtype=torch.int32)
    wpe, embedded = torch.randn(8, 32), torch.zeros(3, 32)  # 8 positions: row 2's next (8) is past the last
    greedy_advance(best, best_index, token, tokens, step, position, advance, start, slot_mask, arrivals,
                   embedding=(w, wpe, embedded))
    expected = logits.argmax(-1)
    assert expected[0] == 10 and torch.equal(token[:, 0], expected) and torch.equal(tokens[:, 2], expected)
    assert tokens.count_nonzero() == expected.count_nonzero()  # nothing written in another step's column
    assert position.tolist() == [[5], [2], [8]] and int(start) == 6 and int(step) == 3 and int(arrivals) == 0
    assert slot_mask[:, 5].all() and slot_mask.sum() == 3  # the step's own slot, for the steps after it
    # the next step's input, as the embedding launch would make it (the last position where none is left)
    torch.testing.assert_close(embedded, w[expected] + wpe[[5, 2, 7]])
