"""What the static-cache backends (torch-compiled, triton) share: StaticGPT2's weights, one
preallocated KV cache per (batch, cache length), prefill through StaticGPT2, and on a GPU the
steps replayed from CUDA graphs: the decode step captured once per cache, the prefill once per
prompt shape, and for plain greedy decoding a step that also takes the argmax and advances its own
inputs, so a token costs one replay and no host work; a sampled step likewise, its tokens drawn on the
device by each row's settings in the slot's SamplingTable (pipeline.runtime.sampler). A subclass says
only how one decode step is computed (and may do a step's tail its own way).

Cache lengths are rounded up (CACHE_ROUNDING) so that requests of similar length share one cache
and its graphs; a decode step that reads only the filled part of the cache pays nothing for that."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from transformers import GPT2LMHeadModel

from pipeline.errors import UserError
from pipeline.precisions import torch_dtype
from pipeline.runtime.backend import Backend
from pipeline.runtime.batch import Batch, left_pad
from pipeline.runtime.kernels.torch_ops import TorchOps
from pipeline.runtime.sampler import sample, sample_rows_alone
from pipeline.runtime.sampling_table import SamplingTable
from pipeline.runtime.static.static_gpt2 import StaticGPT2

CACHE_ROUNDING = 256
PREFILL_GRAPHS = 8  # prompt shapes per cache whose prefill graph is kept; the least recently used goes
WARMUP_RUNS = 3  # before a capture: lets compilation and the allocator settle on a side stream


@dataclass
class CacheSlot:
    """Everything a captured graph reads or writes, at addresses fixed for the slot's lifetime."""
    cache: list[torch.Tensor]  # 2L x [B, H, T, D]
    layers: torch.Tensor | None  # [2L, B, H, T, D] that `cache` views, where the backend keeps one buffer
    slot_mask: torch.Tensor  # [B, T] bool: which slots hold real tokens
    token: torch.Tensor  # [B, 1] decode input
    position: torch.Tensor  # [B, 1]
    advance: torch.Tensor  # [B, 1] how far a greedy step moves each position: 1 (the serving scheduler's free rows 0)
    first: torch.Tensor  # [B] int64: each row's first filled slot (0 but in the serving scheduler's wide cache)
    start: torch.Tensor  # scalar int64: the slot the next decode step writes (a prefill takes its start from the host)
    step: torch.Tensor  # [1] int64: a fused step's column in greedy_tokens
    greedy_tokens: torch.Tensor  # [B, T] int64: what fused steps yield, one column per step, each contiguous
    sampling: SamplingTable  # each row's sampling settings and history, what a sampled step reads
    scratch: dict[str, torch.Tensor] = field(default_factory=dict)  # a subclass's own buffers
    decode: tuple[torch.cuda.CUDAGraph, torch.Tensor] | None = None  # graph, its logits [B, V] fp32
    # fused steps captured, by (sampled, first): the first of a run also prepares it (prepare_steps)
    steps: dict[tuple[bool, bool], torch.cuda.CUDAGraph] = field(default_factory=dict)
    prefill: OrderedDict = field(default_factory=OrderedDict)  # (seq, causal) -> PrefillGraph


@dataclass
class PrefillGraph:
    """A prefill captured for one prompt shape. Its first node copies the batch's ids, mask and positions
    from `staged`, page-locked host memory the host fills, to the device, and the next marks the slots:
    the batch costs the host no launch of its own before the replay."""
    staged: torch.Tensor  # [3, B, S] int64, page-locked: Batch.host
    sent: torch.Tensor  # [3, B, S] int64 on the device, what the first node copies `staged` into: held here, since
    # the graph does not own it, and once freed its memory went to other tensors or back to the driver
    copied: torch.cuda.Event  # recorded after each replay: `staged` may be refilled once it has passed
    graph: torch.cuda.CUDAGraph | None = None
    logits: torch.Tensor | None = None  # what each replay rewrites

    def stage(self, batch: Batch) -> None:
        """The host's batch for the next replay into `staged`, once the last replay has copied it out."""
        self.copied.synchronize()
        self.staged.copy_(batch.host)

    @classmethod
    def captured(cls, batch: Batch, prefill: Callable, device: torch.device, pool) -> PrefillGraph:
        """prefill(ids, mask, positions) captured for the batch's shape, its inputs copied in from `staged`."""
        entry = cls(torch.empty(batch.host.shape, dtype=torch.long, pin_memory=True),
                    torch.empty(batch.host.shape, dtype=torch.long, device=device), torch.cuda.Event())
        entry.stage(batch)  # the capture's warm-up runs read them
        entry.graph, entry.logits = capture(lambda: prefill(*entry.sent.copy_(entry.staged, non_blocking=True).unbind(0)),
                                            device, pool)  # the first node: the batch in from the host
        return entry

    def replay(self, batch: Batch) -> torch.Tensor:
        """The graph run on this batch, staged first -> its logits buffer."""
        self.stage(batch)
        self.graph.replay()
        self.copied.record()
        return self.logits


def capture(fn: Callable[[], torch.Tensor], device: torch.device, pool=None) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """Warm fn up on a side stream, then record it into a CUDA graph (its memory from `pool`, shared
    with the pool's other graphs, when given). Returns the graph and fn's output, a buffer every
    replay rewrites. The graph is recorded, not run: replay it."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(WARMUP_RUNS):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out


class StaticCacheBackend(Backend):
    fused_greedy = True  # greedy_steps: one graph replay a token
    fused_sampling = True  # sampled_steps likewise
    own_scoring = True  # sequence_logits: the prefill on a cache of its own
    fold_layer_norms = False  # StaticGPT2's option: for kernels that fuse each norm into the product after it
    # every layer's cache in one buffer (CacheSlot.layers): the serving scheduler copies rows of all layers
    # in one launch; not for torch.compile, which copies a whole base buffer where a step writes a view
    cache_in_one_buffer = False
    prefill_ops = TorchOps  # StaticGPT2's option: what the prefill's elementwise work runs as
    row_local = False  # make_row_local: every row's logits and draws its own alone

    def __init__(self, model: GPT2LMHeadModel, precision: str, device: str | torch.device, cuda_graphs: bool | None = None):
        self.precision, self.device = precision, torch.device(device)
        self.n_positions, self.vocab_size = model.config.n_positions, model.config.vocab_size
        self.net = StaticGPT2(model, torch_dtype(precision), self.fold_layer_norms, self.prefill_ops).to(self.device).eval()
        self.cuda_graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        # prefill graphs run one at a time and their logits are read before the next: their scratch
        # memory can be one pool, so many prompt shapes cost the memory of the largest
        self.prefill_pool = torch.cuda.graph_pool_handle() if self.cuda_graphs else None
        self.slots: dict[tuple[int, int], CacheSlot] = {}
        self.slot: CacheSlot | None = None
        self.length = 0  # slots filled in the slot's cache: the next decode step writes this one
        self.scoring_slot: CacheSlot | None = None  # sequence_logits' one-row cache, as long as the longest scored

    def decode_step(self, s: CacheSlot) -> torch.Tensor:
        """One decode step from s.token/position/start over s.cache -> logits [B, V] fp32."""
        raise NotImplementedError

    def make_row_local(self) -> None:
        """From here on each row's logits and draws depend on that row alone, not on the rows beside it or
        on where its slots sit in the cache, given one batch shape (serve --deterministic; docs/design.md,
        "Deterministic serving"). A backend whose step cannot says so."""
        raise UserError(f"--deterministic: the {self.name} backend has no row-local step; serve triton, torch-compiled "
                        "on the CPU, or a backend that runs one request at a time (torch, ort, ort-fused)")

    def new_slot(self, batch: int, length: int, rows_of: CacheSlot | None = None) -> CacheSlot:
        """A slot of its own cache, or, with rows_of, one whose cache, slot marks and per-row inputs (token,
        position, advance, first) are the first `batch` rows of that slot's (a row-count bucket of a larger
        batch: rows in front are contiguous views, so every bucket reads the inputs where they are)."""
        long = dict(dtype=torch.long, device=self.device)
        if rows_of is None:
            layers = self.net.new_cache(batch, length, one_buffer=True) if self.cache_in_one_buffer else None
            cache = list(layers.unbind(0)) if layers is not None else self.net.new_cache(batch, length)
            marks = torch.zeros(batch, length, dtype=torch.bool, device=self.device)
            inputs = (torch.zeros(batch, 1, **long), torch.zeros(batch, 1, **long), torch.ones(batch, 1, **long),
                      torch.zeros(batch, **long))
            sampling = SamplingTable.new(batch, self.vocab_size, self.device)
        else:
            cache, marks = [t[:batch] for t in rows_of.cache], rows_of.slot_mask[:batch]
            layers = rows_of.layers[:, :batch] if rows_of.layers is not None else None
            inputs = rows_of.token[:batch], rows_of.position[:batch], rows_of.advance[:batch], rows_of.first[:batch]
            sampling = rows_of.sampling.first(batch)
        # a step's tokens contiguous: the serving scheduler copies each step's to the host as it completes,
        # and a column of a row-major buffer took a gather kernel before every copy
        steps = torch.zeros(length, batch, **long).t()
        return CacheSlot(cache, layers, marks, *inputs, torch.zeros((), **long), torch.zeros(1, **long), steps, sampling)

    def bind(self, slot: CacheSlot, filled: int) -> None:
        """Run on `slot` from here on, its cache filled up to slot `filled` (the next step writes there): how
        the serving scheduler moves the backend between its row buckets."""
        self.slot, self.length = slot, filled

    def sampling_table(self) -> SamplingTable:
        """The current slot's sampling settings: what sampled_steps reads, filled before they run."""
        return self.slot.sampling

    def cache_length(self, max_len: int) -> int:
        """The length of the cache that holds max_len tokens: rounded up, but not past the context."""
        return min(-(-max_len // CACHE_ROUNDING) * CACHE_ROUNDING, max(self.n_positions, max_len))

    def reset(self, batch: int, max_len: int) -> None:
        length = self.cache_length(max_len)
        if (batch, length) not in self.slots:
            self.slots[batch, length] = self.new_slot(batch, length)
        self.slot = self.slots[batch, length]  # its slot marks are rewritten as the cache fills (mark_slots)
        self.length = 0

    def marked_decode_step(self, s: CacheSlot) -> torch.Tensor:
        """decode_step, then its slot marked real in s.slot_mask for the steps after it (attention
        counts a query's own slot marked or not): the host marks nothing before a replay."""
        logits = self.decode_step(s)
        s.slot_mask.index_fill_(1, s.start.view(1), True)
        return logits

    def greedy_step(self, s: CacheSlot) -> None:
        """One greedy step that feeds the next: s.token at s.position into slot s.start, its argmax
        into s.greedy_tokens[:, s.step] and s.token; the slot is marked real in s.slot_mask, position
        advances by s.advance, slot and step by one."""
        self.advance_inputs(s, self.marked_decode_step(s).argmax(-1, keepdim=True))

    def sampled_step(self, s: CacheSlot) -> None:
        """greedy_step with each row's token drawn by its settings in s.sampling (greedy rows: the argmax)."""
        logits = self.marked_decode_step(s)
        token = sample_rows_alone(logits, s.sampling, s.position) if self.row_local else sample(logits, s.sampling, s.position)
        self.advance_inputs(s, token[:, None])

    def advance_inputs(self, s: CacheSlot, token: torch.Tensor) -> None:
        """A fused step's tail: token [B, 1] into s.greedy_tokens[:, s.step] and s.token, every counter on."""
        s.greedy_tokens.index_copy_(1, s.step, token)
        s.token.copy_(token)
        s.position.add_(s.advance)
        for counter in (s.start, s.step):
            counter.add_(1)

    def prepare_steps(self, s: CacheSlot) -> None:
        """Whatever a fused step reads besides s.token/position/start/step, made from them before the first step."""

    def fused_step(self, s: CacheSlot, sampled: bool, first: bool) -> None:
        if first:
            self.prepare_steps(s)
        (self.sampled_step if sampled else self.greedy_step)(s)

    @torch.inference_mode()
    def greedy_steps(self, token: torch.Tensor, position: torch.Tensor, count: int) -> Iterator[torch.Tensor]:
        """As Backend.greedy_steps. On a GPU a step is one replay of a graph that also takes the argmax
        and advances the inputs, where decode() needs small launches around its replay."""
        return self.start_steps(token, position, count, sampled=False)

    @torch.inference_mode()
    def sampled_steps(self, token: torch.Tensor, position: torch.Tensor, count: int) -> Iterator[torch.Tensor]:
        """greedy_steps drawing each row's token by the settings filled into sampling_table()."""
        return self.start_steps(token, position, count, sampled=True)

    def start_steps(self, token: torch.Tensor, position: torch.Tensor, count: int, sampled: bool) -> Iterator[torch.Tensor]:
        self.slot.token.copy_(token[:, None])
        self.slot.position.copy_(position)
        return self.steps_in_place(count, sampled=sampled)

    @torch.inference_mode()
    def steps_in_place(self, count: int, column: int = 0, sampled: bool = False) -> Iterator[torch.Tensor]:
        """Fused steps (greedy, or sampled) from the inputs the slot holds (s.token, s.position), where the
        serving scheduler keeps them between steps, their tokens into s.greedy_tokens from `column` on.
        On a GPU the first step is a graph of its own that also prepares the steps (prepare_steps): that
        launch outside a graph cost the serving scheduler more host time than a step (docs/journal/performance.md)."""
        s = self.slot

        def set_counters() -> None:
            s.start.fill_(self.length)
            s.step.fill_(column)

        set_counters()
        if self.cuda_graphs and (sampled, False) not in s.steps:
            # the warm-up runs steps from the inputs, and draws count the picks of penalised rows
            saved = s.token.clone(), s.position.clone(), s.sampling.counts.clone()
            for first in (True, False):
                s.steps[sampled, first] = capture(lambda first=first: self.fused_step(s, sampled, first), self.device)[0]
            for t, kept in zip((s.token, s.position, s.sampling.counts), saved):
                t.copy_(kept)
            set_counters()
        for i in range(count):
            if self.cuda_graphs:
                s.steps[sampled, i == 0].replay()
            else:
                self.fused_step(s, sampled, i == 0)
            self.length += 1
            yield s.greedy_tokens[:, column + i]

    @torch.inference_mode()
    def prefill(self, batch: Batch, last_only: bool = True) -> torch.Tensor:
        """As Backend.prefill, from slot 0. On a GPU with last_only the result is a graph's output
        buffer, replayed from the prompt shape's graph (PrefillGraph) with the batch taken from the host."""
        s, seq = self.slot, batch.host_ids.shape[1]
        self.length = seq
        if seq == 1:  # a one-token prompt is a decode step into slot 0
            self.mark_slots(batch.attention_mask, 0)
            return self.replay_decode(batch.input_ids, batch.position_ids, 0)[:, None]
        # a prompt without padding takes attention without a mask (StaticGPT2's causal) and reads no slot marks
        causal = not batch.padded
        prefill = lambda ids, pos: self.net.prefill(ids, pos, s.slot_mask, s.cache, 0, last_only, causal).float()  # noqa: E731
        if self.cuda_graphs and last_only:
            return self.replay_prefill(prefill, batch, causal)
        self.mark_slots(batch.attention_mask, 0)  # full logits are for validation, not speed: no graph
        return prefill(batch.input_ids, batch.position_ids)

    @torch.inference_mode()
    def sequence_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """As Backend.sequence_logits: the prefill the engine serves with (its kernels, its precision), on a
        one-row cache of its own, so the slot in use and its fill are as they were after it."""
        if self.scoring_slot is None or self.scoring_slot.slot_mask.shape[1] < len(ids):
            self.scoring_slot = None  # the shorter one's memory back first
            self.scoring_slot = self.new_slot(1, self.cache_length(len(ids)))
        serving, filled = self.slot, self.length
        self.bind(self.scoring_slot, 0)
        try:
            return self.prefill(left_pad(ids[None].numpy(), 0, self.device), last_only=False)[0]
        finally:
            self.bind(serving, filled)

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """As Backend.decode. On a GPU the result is the decode graph's output buffer."""
        self.length += 1
        return self.replay_decode(tokens, positions, self.length - 1)

    def replay_decode(self, tokens: torch.Tensor | None, positions: torch.Tensor | None, slot: int) -> torch.Tensor:
        """The decode step, replayed from the slot's graph on a GPU: tokens/positions [B, 1] (None: those
        the slot holds) into slot, which is marked real -> [B, V]."""
        s = self.slot
        s.start.fill_(slot)
        if tokens is not None:
            s.token.copy_(tokens)
            s.position.copy_(positions)
        if not self.cuda_graphs:
            return self.marked_decode_step(s)
        if s.decode is None:
            s.decode = capture(lambda: self.marked_decode_step(s), self.device)
        s.decode[0].replay()
        return s.decode[1]

    def mark_slots(self, attention_mask: torch.Tensor, start: int) -> None:
        """Slots from start marked real or padding from the attention mask's columns from start.
        Slots after them keep an earlier generation's marks: attention reads only slots up to its
        query's own, all marked by then, so a reset clears nothing."""
        self.slot.slot_mask[:, start:attention_mask.shape[1]].copy_(attention_mask[:, start:])  # one kernel, int64 -> bool

    def replay_prefill(self, prefill: Callable, batch: Batch, causal: bool) -> torch.Tensor:
        """prefill(ids, positions) replayed from the slot's CUDA graph for the batch's shape (seq, causal),
        captured on first use (the least recently used of PREFILL_GRAPHS shapes goes). Returns the
        graph's logits buffer."""
        graphs, shape = self.slot.prefill, (batch.host.shape[2], causal)
        if shape not in graphs:
            def run(ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
                self.mark_slots(mask, 0)
                return prefill(ids, positions)
            graphs[shape] = PrefillGraph.captured(batch, run, self.device, self.prefill_pool)
            if len(graphs) > PREFILL_GRAPHS:
                graphs.popitem(last=False)
        graphs.move_to_end(shape)
        return graphs[shape].replay(batch)
