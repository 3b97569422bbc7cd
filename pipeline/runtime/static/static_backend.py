"""What the static-cache backends (torch-compiled, triton) share: StaticGPT2's weights, one
preallocated KV cache per (batch, cache length), prefill through StaticGPT2, and on a GPU the
steps replayed from CUDA graphs: the decode step captured once per cache, the prefill once per
prompt shape, and for plain greedy decoding a step that also takes the argmax and advances its own
inputs, so a token costs one replay and no host work. A subclass says only how one decode step is
computed (and may do the greedy tail its own way).

Cache lengths are rounded up (CACHE_ROUNDING) so that requests of similar length share one cache
and its graphs; a decode step that reads only the filled part of the cache pays nothing for that."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from transformers import GPT2LMHeadModel

from pipeline.precisions import torch_dtype
from pipeline.runtime.backend import Backend
from pipeline.runtime.batch import Batch
from pipeline.runtime.kernels.torch_ops import TorchOps
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
    step: torch.Tensor  # [1] int64: greedy_steps' column in greedy_tokens
    greedy_tokens: torch.Tensor  # [B, T] int64: what greedy_steps yields, one column per step, each contiguous
    scratch: dict[str, torch.Tensor] = field(default_factory=dict)  # a subclass's own buffers
    decode: tuple[torch.cuda.CUDAGraph, torch.Tensor] | None = None  # graph, its logits [B, V] fp32
    greedy: torch.cuda.CUDAGraph | None = None  # greedy_step, captured
    first_greedy: torch.cuda.CUDAGraph | None = None  # prepare_greedy and greedy_step, captured
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
    fold_layer_norms = False  # StaticGPT2's option: for kernels that fuse each norm into the product after it
    # every layer's cache in one buffer (CacheSlot.layers): the serving scheduler copies rows of all layers
    # in one launch; not for torch.compile, which copies a whole base buffer where a step writes a view
    cache_in_one_buffer = False
    prefill_ops = TorchOps  # StaticGPT2's option: what the prefill's elementwise work runs as

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

    def decode_step(self, s: CacheSlot) -> torch.Tensor:
        """One decode step from s.token/position/start over s.cache -> logits [B, V] fp32."""
        raise NotImplementedError

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
        else:
            cache, marks = [t[:batch] for t in rows_of.cache], rows_of.slot_mask[:batch]
            layers = rows_of.layers[:, :batch] if rows_of.layers is not None else None
            inputs = rows_of.token[:batch], rows_of.position[:batch], rows_of.advance[:batch], rows_of.first[:batch]
        # a step's tokens contiguous: the serving scheduler copies each step's to the host as it completes,
        # and a column of a row-major buffer took a gather kernel before every copy
        steps = torch.zeros(length, batch, **long).t()
        return CacheSlot(cache, layers, marks, *inputs, torch.zeros((), **long), torch.zeros(1, **long), steps)

    def reset(self, batch: int, max_len: int) -> None:
        length = min(-(-max_len // CACHE_ROUNDING) * CACHE_ROUNDING, max(self.n_positions, max_len))
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
        token = self.marked_decode_step(s).argmax(-1, keepdim=True)
        s.greedy_tokens.index_copy_(1, s.step, token)
        s.token.copy_(token)
        s.position.add_(s.advance)
        for counter in (s.start, s.step):
            counter.add_(1)

    def prepare_greedy(self, s: CacheSlot) -> None:
        """Whatever greedy_step reads besides s.token/position/start/step, made from them before the first step."""

    def first_greedy_step(self, s: CacheSlot) -> None:
        """The first of greedy_steps' steps: prepare_greedy, then greedy_step."""
        self.prepare_greedy(s)
        self.greedy_step(s)

    @torch.inference_mode()
    def greedy_steps(self, token: torch.Tensor, position: torch.Tensor, count: int) -> Iterator[torch.Tensor]:
        """As Backend.greedy_steps. On a GPU a step is one replay of a graph that also takes the argmax
        and advances the inputs, where decode() needs small launches around its replay."""
        self.slot.token.copy_(token[:, None])
        self.slot.position.copy_(position)
        return self.greedy_in_place(count)

    @torch.inference_mode()
    def greedy_in_place(self, count: int, column: int = 0) -> Iterator[torch.Tensor]:
        """greedy_steps from the inputs the slot holds (s.token, s.position), where the serving scheduler
        keeps them between steps, their tokens into s.greedy_tokens from `column` on. On a GPU the first
        step is a graph of its own that also prepares the steps (prepare_greedy): with that launch outside
        a graph a greedy launch cost the serving scheduler 368 us of host time against 100 for a decode
        step (docs/performance.md)."""
        s = self.slot

        def set_counters() -> None:
            s.start.fill_(self.length)
            s.step.fill_(column)

        set_counters()
        if self.cuda_graphs and s.greedy is None:
            inputs = s.token.clone(), s.position.clone()
            s.first_greedy = capture(lambda: self.first_greedy_step(s), self.device)[0]
            s.greedy = capture(lambda: self.greedy_step(s), self.device)[0]
            s.token.copy_(inputs[0])  # capture's warm-up ran steps from them
            s.position.copy_(inputs[1])
            set_counters()
        for i in range(count):
            if self.cuda_graphs:
                (s.greedy if i else s.first_greedy).replay()
            else:
                (self.greedy_step if i else self.first_greedy_step)(s)
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
        captured on first use; the graph copies the batch from the host and marks its slots. Returns the
        graph's logits buffer."""
        s, shape = self.slot, (batch.host.shape[2], causal)
        entry = s.prefill.get(shape)
        if entry is None:
            entry = PrefillGraph(torch.empty(batch.host.shape, dtype=torch.long, pin_memory=True),
                                 torch.empty(batch.host.shape, dtype=torch.long, device=self.device), torch.cuda.Event())
            entry.stage(batch)  # the capture's warm-up runs read them

            def run() -> torch.Tensor:
                ids, mask, positions = entry.sent.copy_(entry.staged, non_blocking=True).unbind(0)
                self.mark_slots(mask, 0)
                return prefill(ids, positions)

            entry.graph, entry.logits = capture(run, self.device, self.prefill_pool)
            s.prefill[shape] = entry
            if len(s.prefill) > PREFILL_GRAPHS:
                s.prefill.popitem(last=False)
        else:
            entry.stage(batch)
        s.prefill.move_to_end(shape)
        entry.graph.replay()
        entry.copied.record()
        return entry.logits
