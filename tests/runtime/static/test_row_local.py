"""Row-local decoding (serve --deterministic): a row's logits are bitwise those it gets in any other
row of the batch, beside any other rows, wherever its slots sit in the cache; the default step's are
not, which is what the mode is for."""

import pytest
import torch
import torch.nn.functional as F

from pipeline.errors import UserError
from pipeline.runtime.sampler import sample_rows_alone
from pipeline.runtime.sampling import Sampling
from pipeline.runtime.static.torch_compiled import TorchCompiledBackend

BATCH, LENGTH, COLUMNS = 8, 13, 48  # the row holds LENGTH slots of a cache COLUMNS wide


@pytest.mark.parametrize("k, n", [(64, 192), (64, 50304), (768, 2304), (3072, 768)])
def test_a_product_computes_every_row_alike_within_one_shape(k, n):
    """What the mode's one batch shape relies on: the matrix library gives a row the same result at any
    row of a product of one shape (it may not across shapes: a row alone takes another kernel)."""
    torch.manual_seed(0)
    w, b, x = torch.randn(n, k) * 0.02, torch.randn(n), torch.randn(64, k)
    order = torch.randperm(64)
    assert torch.equal(F.linear(x[order], w, b), F.linear(x, w, b)[order])


def decode_logits(backend, row: int, first: int, others: int) -> torch.Tensor:
    """The logits of one row whose keys and values (a fixed random history of LENGTH slots) end at the
    slot before the step's, placed at cache row `row` from slot `first`, the other rows holding histories
    drawn from seed `others`."""
    s = backend.new_slot(BATCH, COLUMNS)
    generator = torch.Generator().manual_seed(others)
    for t in s.cache:
        t.copy_(torch.randn(t.shape, generator=generator))
    s.token.copy_(torch.randint(0, backend.vocab_size, (BATCH, 1), generator=generator))
    s.position.copy_(torch.randint(0, 40, (BATCH, 1), generator=generator))
    s.slot_mask.fill_(True)
    mine = torch.Generator().manual_seed(1)
    start = first + LENGTH
    for t in s.cache:
        t[row, :, first:start] = torch.randn(t.shape[1], LENGTH, t.shape[3], generator=mine)
    s.slot_mask[row] = False
    s.slot_mask[row, first:start] = True
    s.first[row], s.token[row], s.position[row] = first, 464 % backend.vocab_size, LENGTH
    s.start.fill_(start)
    return backend.marked_decode_step(s)[row]


PLACEMENTS = [(0, 0, 10), (5, 21, 11), (7, 3, 12), (2, 34, 13)]  # (row, first slot, the other rows' seed)


def row_local_logits(backend) -> list[torch.Tensor]:
    """One row's logits at each of PLACEMENTS, the backend made row-local."""
    backend.make_row_local()
    return [decode_logits(backend, *p) for p in PLACEMENTS]


def test_a_rows_logits_are_bitwise_alike_in_any_row_beside_any_rows_from_any_slot(model):
    logits = row_local_logits(TorchCompiledBackend(model, "fp32", "cpu", compile=False))
    assert all(torch.equal(logits[0], other) for other in logits[1:])


def test_the_default_step_is_not_row_local(model):
    """The same placements through the default step, whose attention reduces over the whole cache: the
    row's logits move with where its slots sit (why the default mode promises the draws, not the tokens)."""
    backend = TorchCompiledBackend(model, "fp32", "cpu", compile=False)
    logits = [decode_logits(backend, *p) for p in PLACEMENTS]
    assert not all(torch.equal(logits[0], other) for other in logits[1:])
    assert all(torch.allclose(logits[0], other, atol=1e-5) for other in logits[1:])


def test_a_rows_draw_alone_is_its_draw_in_any_batch(model):
    backend = TorchCompiledBackend(model, "fp32", "cpu", compile=False)
    table = backend.new_slot(BATCH, COLUMNS).sampling
    settings = Sampling(max_new_tokens=4, do_sample=True, temperature=0.9, top_p=0.95, seed=7)
    table.fill(list(range(BATCH)), [(settings, 0)] * BATCH, [[464]] * BATCH)
    logits = torch.randn(BATCH, model.config.vocab_size, generator=torch.Generator().manual_seed(3)) * 4
    positions = torch.full((BATCH, 1), 9)
    together = sample_rows_alone(logits, table, positions)
    for row in range(BATCH):
        assert sample_rows_alone(logits[row:row + 1], table, positions[row:row + 1]) == together[row]


def test_row_local_steps_are_refused_where_they_are_not_built(model):
    from pipeline.runtime.static.static_backend import StaticCacheBackend

    class Other(StaticCacheBackend):
        name = "other"
    with pytest.raises(UserError, match="--deterministic: the other backend has no row-local step; serve triton, torch-compiled"):
        Other(model, "fp32", "cpu").make_row_local()
