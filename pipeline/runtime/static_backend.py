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

from pipeline.runtime.static_gpt2 import StaticGPT2, TorchOps
from pipeline.runtime.torch_eager import TORCH_DTYPES

CACHE_ROUNDING = 256
PREFILL_GRAPHS = 8  # prompt shapes per cache whose prefill graph is kept; the least recently used goes
WARMUP_RUNS = 3  # before a capture: lets compilation and the allocator settle on a side stream


@dataclass
class CacheSlot:
    """Everything a captured graph reads or writes, at addresses fixed for the slot's lifetime."""
    cache: list[torch.Tensor]  # 2L x [B, H, T, D]
    slot_mask: torch.Tensor  # [B, T] bool: which slots hold real tokens
    token: torch.Tensor  # [B, 1] decode input
    position: torch.Tensor  # [B, 1]
    start: torch.Tensor  # scalar int64: the slot the next decode step writes (a prefill takes its start from the host)
    step: torch.Tensor  # [1] int64: greedy_steps' column in greedy_tokens
    greedy_tokens: torch.Tensor  # [B, T] int64: what greedy_steps yields, one column per step
    scratch: dict[str, torch.Tensor] = field(default_factory=dict)  # a subclass's own buffers
    decode: tuple[torch.cuda.CUDAGraph, torch.Tensor] | None = None  # graph, its logits [B, V] fp32
    greedy: torch.cuda.CUDAGraph | None = None  # greedy_step, captured
    prefill: OrderedDict = field(default_factory=OrderedDict)  # (start, seq, causal) -> PrefillGraph


@dataclass
class PrefillGraph:
    """A prefill captured for one prompt shape. Its first node copies the ids from `staged`, page-locked
    host memory the host fills, to the device: the ids cost the host no launch of their own before
    the replay (right after a generation each launch took it 20-70 us)."""
    staged: torch.Tensor  # [B, S] int64, page-locked
    positions: torch.Tensor  # [B, S] on the device (a causal prefill's are its slots: not read)
    copied: torch.cuda.Event  # recorded after each replay: `staged` may be refilled once it has passed
    graph: torch.cuda.CUDAGraph | None = None
    logits: torch.Tensor | None = None  # what each replay rewrites

    def stage(self, input_ids: torch.Tensor) -> None:
        """The ids of the next replay into `staged`: from the host, once the last replay has copied
        it out; ids already on the device go round through it in stream order, before the replay."""
        if input_ids.is_cuda:
            self.staged.copy_(input_ids, non_blocking=True)
        else:
            self.copied.synchronize()
            self.staged.copy_(input_ids)


def capture(fn: Callable[[], torch.Tensor], device: torch.device) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """Warm fn up on a side stream, then record it into a CUDA graph. Returns the graph and fn's
    output, a buffer every replay rewrites. The graph is recorded, not run: replay it."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(WARMUP_RUNS):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


class StaticCacheBackend:
    name: str
    takes_host_ids = True  # Backend's option: a prefill graph copies the ids to the device itself (PrefillGraph)
    fold_layer_norms = False  # StaticGPT2's option: for kernels that fuse each norm into the product after it
    prefill_ops = TorchOps  # StaticGPT2's option: what the prefill's elementwise work runs as

    def __init__(self, model: GPT2LMHeadModel, precision: str, device: str | torch.device, cuda_graphs: bool | None = None):
        self.precision, self.device = precision, torch.device(device)
        self.n_positions, self.vocab_size = model.config.n_positions, model.config.vocab_size
        self.net = StaticGPT2(model, TORCH_DTYPES[precision], self.fold_layer_norms, self.prefill_ops).to(self.device).eval()
        self.cuda_graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        self.slots: dict[tuple[int, int], CacheSlot] = {}
        self.slot: CacheSlot | None = None

    def decode_step(self, s: CacheSlot) -> torch.Tensor:
        """One decode step from s.token/position/start over s.cache -> logits [B, V] fp32."""
        raise NotImplementedError

    def new_slot(self, batch: int, length: int) -> CacheSlot:
        long = dict(dtype=torch.long, device=self.device)
        return CacheSlot(self.net.new_cache(batch, length), torch.zeros(batch, length, dtype=torch.bool, device=self.device),
                         torch.zeros(batch, 1, **long), torch.zeros(batch, 1, **long), torch.zeros((), **long),
                         torch.zeros(1, **long), torch.zeros(batch, length, **long))

    def reset(self, batch: int, max_len: int) -> None:
        length = min(-(-max_len // CACHE_ROUNDING) * CACHE_ROUNDING, max(self.n_positions, max_len))
        if (batch, length) not in self.slots:
            self.slots[batch, length] = self.new_slot(batch, length)
        self.slot = self.slots[batch, length]  # its slot marks are rewritten as the cache fills (mark_slots)

    def greedy_step(self, s: CacheSlot) -> None:
        """One greedy step that feeds the next: s.token at s.position into slot s.start, its argmax
        into s.greedy_tokens[:, s.step] and s.token; position, slot and step advance by one and the
        new slot is marked real in s.slot_mask."""
        token = self.decode_step(s).argmax(-1, keepdim=True)
        s.greedy_tokens.index_copy_(1, s.step, token)
        s.token.copy_(token)
        for counter in (s.position, s.start, s.step):
            counter.add_(1)
        s.slot_mask.index_fill_(1, s.start.view(1), True)

    def prepare_greedy(self, s: CacheSlot) -> None:
        """Whatever greedy_step reads besides s.token/position/start/step, made from them before the first step."""

    @torch.inference_mode()
    def greedy_steps(self, token: torch.Tensor, position: torch.Tensor, slot: int, count: int) -> Iterator[torch.Tensor]:
        """Greedy decoding after a prefill with the host out of the loop: token [B] goes in at
        position [B, 1] and cache slot `slot`, then each step's argmax feeds the step after. Yields
        count next tokens [B], columns of one buffer that stay valid until the next generation. On a
        GPU a step is one replay of a graph that also takes the argmax and advances the inputs, where
        forward() needs five small launches around its replay."""
        s = self.slot

        def set_inputs() -> None:
            s.token.copy_(token[:, None])
            s.position.copy_(position)
            s.start.fill_(slot)
            s.step.zero_()
            self.prepare_greedy(s)

        set_inputs()
        s.slot_mask[:, slot] = True
        if self.cuda_graphs and s.greedy is None:
            s.greedy = capture(lambda: self.greedy_step(s), self.device)[0]
            set_inputs()  # capture's warm-up ran steps from them
        for i in range(count):
            if self.cuda_graphs:
                s.greedy.replay()
            else:
                self.greedy_step(s)
            yield s.greedy_tokens[:, i]

    @torch.inference_mode()
    def forward(self, input_ids, attention_mask, position_ids, last_only: bool = False, padded: bool | None = None):
        """As Backend.forward. On a GPU the result is a graph's output buffer: valid until the next call."""
        s = self.slot
        seq = input_ids.shape[1]
        start = attention_mask.shape[1] - seq
        # a prompt without padding takes attention without a mask (StaticGPT2's causal). Unless the
        # caller says (Generator does), telling costs a wait for the device, as Hugging Face's SDPA
        # attention pays for the same check: 30-60 us of the time to first token on an H200's host
        first_prefill = start == 0 and seq > 1  # a decode step (seq 1) always takes the mask
        if first_prefill and padded is None:
            padded = not bool(attention_mask.all())
        causal = first_prefill and not padded
        # a causal prefill reads no slot marks: they go in after its launch, where on a GPU they cost
        # the first token nothing (each launch before it does: PrefillGraph's docstring)
        if not causal:
            self.mark_slots(attention_mask, start, seq)
        if seq == 1:  # a prefill takes its start as a host int; only the decode step reads it from the device
            s.start.fill_(start)
            s.token.copy_(input_ids)
            s.position.copy_(position_ids)
            if not self.cuda_graphs:
                return self.decode_step(s)[:, None]
            if s.decode is None:
                s.decode = capture(lambda: self.decode_step(s), self.device)
            s.decode[0].replay()
            return s.decode[1][:, None]
        prefill = lambda ids, pos: self.net(ids, pos, s.slot_mask, start, s.cache, last_only, causal).float()  # noqa: E731
        if self.cuda_graphs and last_only:
            logits = self.replay_prefill(prefill, input_ids, position_ids, (start, seq, causal))
        else:  # full logits are for validation, not speed: no graph
            logits = prefill(input_ids.to(self.device), position_ids)
        if causal:
            self.mark_slots(attention_mask, start, seq)
        return logits

    def mark_slots(self, attention_mask: torch.Tensor, start: int, seq: int) -> None:
        """Slots start.. start + seq marked real or padding from the attention mask's last seq columns.
        Slots after them keep an earlier generation's marks: attention reads only slots up to its
        query's own, all marked by then, so a reset clears nothing."""
        self.slot.slot_mask[:, start:start + seq].copy_(attention_mask[:, start:])  # one kernel, int64 -> bool

    def replay_prefill(self, prefill: Callable, input_ids: torch.Tensor, position_ids: torch.Tensor,
                       shape: tuple[int, int, bool]) -> torch.Tensor:
        """prefill(ids, positions) replayed from the slot's CUDA graph for shape (start, seq, causal),
        captured on first use. input_ids on the host or the device. Returns the graph's logits buffer."""
        s, causal = self.slot, shape[2]
        entry = s.prefill.get(shape)
        if entry is None:
            entry = PrefillGraph(torch.empty(input_ids.shape, dtype=torch.long, pin_memory=True), position_ids.clone(),
                                 torch.cuda.Event())
            entry.stage(input_ids)  # the capture's warm-up runs read them
            ids = torch.empty(input_ids.shape, dtype=torch.long, device=self.device)
            entry.graph, entry.logits = capture(
                lambda: prefill(ids.copy_(entry.staged, non_blocking=True), entry.positions), self.device)
            s.prefill[shape] = entry
            if len(s.prefill) > PREFILL_GRAPHS:
                s.prefill.popitem(last=False)
        else:
            entry.stage(input_ids)
            if not causal:  # a causal prefill's positions are its slots: StaticGPT2 does not read them
                entry.positions.copy_(position_ids)
        s.prefill.move_to_end(shape)
        entry.graph.replay()
        entry.copied.record()
        return entry.logits
