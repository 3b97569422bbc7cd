"""Hand-written kernels: the prefill is StaticGPT2's forward in a CUDA graph per prompt shape, with
its elementwise work fused (prefill_kernels) and, in int8-wo, its products on the int8 weights the
decode step reads (int8_products: no float copy of a matrix is held); each decode step is five Triton kernels per layer
(linear_kernels, decode_attention) captured into one CUDA graph, with attention that reads only the filled part of
the cache; a greedy step adds one launch that picks the token from the LM head's per-program
maxima, advances the step's inputs and embeds the next step's token; a sampled step, two that draw
each row's token from the logits by its settings and check it (sampling_kernels) and do the same."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline.runtime.backend import BackendUnavailable
from pipeline.runtime.kernels.decode_attention import decode_attention
from pipeline.runtime.kernels.int8_products import Int8WeightOps, RowScaled
from pipeline.runtime.kernels.linear_kernels import embed, fused_linear, layer_norm
from pipeline.runtime.kernels.prefill_kernels import TritonOps
from pipeline.runtime.kernels.sampling_kernels import sample_rows
from pipeline.runtime.kernels.step_tail import greedy_advance
from pipeline.runtime.kernels.tiles import argmax_partials, attention_config, attention_partials, head_normalized_apart, layer_norms_apart
from pipeline.runtime.static.static_backend import CacheSlot, StaticCacheBackend


class TritonBackend(StaticCacheBackend):
    name = "triton"
    # the layer norms' weights and biases live in the products after them, so no program of a fused
    # linear loads them and the tiles can normalise after the product (docs/journal/performance.md)
    fold_layer_norms = True
    # the prefill's layer norms take the residual adds (the first the embedding), GELU goes into
    # cuBLASLt's epilogue, causal attention writes the cache as it reads the keys (prefill_kernels)
    prefill_ops = TritonOps
    cache_in_one_buffer = True

    def __init__(self, model, precision: str = "fp16", device="cuda", cuda_graphs: bool | None = None,
                 int8_weights: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None):
        """int8_weights: int8-wo's decode weights, as int8_weights.read_graph_weights reads them from the
        int8-wo graph (the same integers and scales every int8-wo engine runs)."""
        if (precision == "int8-wo") != (int8_weights is not None):
            raise ValueError("int8_weights go with precision int8-wo, and only with it")
        head_dim = model.config.n_embd // model.config.n_head
        if head_dim & (head_dim - 1):  # the attention kernel holds one head in a power-of-two block
            raise BackendUnavailable(f"triton needs a power-of-two head size; this model's is {head_dim}")
        super().__init__(model, ACTIVATIONS[precision], device, cuda_graphs)
        self.precision = precision
        if int8_weights is not None:
            int8_matrices(self.net, int8_weights)
        self.decode_weights = DecodeWeights(self.net)
        # programmatic dependent launch (the kernels package docstring) needs Hopper's griddepcontrol
        self.pdl_capable = self.device.type == "cuda" and torch.cuda.get_device_capability(self.device) >= (9, 0)

    def linear(self, x, name: str, layer: int | None, out, **options) -> None:
        """fused_linear over the decode weights `name` (of `layer`): int8 with their scales in int8-wo;
        row-local, each sum in one order (no split-K)."""
        w, scale, sums = self.decode_weights.of(name, layer)
        if "ln" in options:
            options["ln"] = (sums, options["ln"])
        fused_linear(x, w, out, scale=scale, fixed_order=self.row_local, **options)

    def make_row_local(self) -> None:
        """Row-local (StaticCacheBackend.make_row_local) on these kernels: every product without split-K,
        whose atomic adds land in any order, and each row's attention over shares anchored at its first
        slot; within the serving scheduler's one batch shape a product computes every row alike, and the
        sampler's and the argmax's partials merge in a fixed order already."""
        self.row_local = True

    def attention_first(self, s: CacheSlot) -> torch.Tensor | None:
        """Where each row's attention starts its shares: its first filled slot in a cache much wider than
        the context (the serving scheduler's) or when row-local, else the cache's start (None)."""
        return s.first if self.row_local or self.reads_from_first(s.cache[0].shape[2]) else None

    def streams_weights(self, batch: int) -> bool:
        """Whether every launch lets the next start at once (the kernels package docstring: early) rather
        than only the QKV launch: only at batch 1, where each row product requests its weights before
        it waits; larger batches' tiles request nothing before their wait, so an early start only
        holds multiprocessors the launches before need (measured: docs/journal/performance.md)."""
        return batch == 1

    def new_slot(self, batch: int, length: int, rows_of: CacheSlot | None = None) -> CacheSlot:
        s = super().new_slot(batch, length, rows_of)
        net, dtype = self.net, self.net.wte.dtype
        f32 = dict(dtype=torch.float32, device=self.device)
        s.scratch = {"x": torch.empty(batch, net.n_embd, **f32),  # residual stream
                     "q": torch.empty(batch, net.n_embd, dtype=dtype, device=self.device),
                     "attention": torch.empty(batch, net.n_embd, dtype=dtype, device=self.device),
                     "hidden": torch.empty(batch, 4 * net.n_embd, dtype=dtype, device=self.device),
                     "normalized": torch.empty(batch, net.n_embd, dtype=dtype, device=self.device),  # the LM head's input
                     "logits": torch.empty(batch, self.vocab_size, **f32)}
        # greedy_step's argmax, in two stages
        partials = argmax_partials(batch, self.vocab_size, net.n_embd, narrow=self.decode_weights.narrow)
        shares = attention_config(batch, filled=self.row_local or self.reads_from_first(length), heads=net.n_head)
        s.scratch.update(best=torch.empty(batch, partials, **f32),
                         best_index=torch.empty(batch, partials, dtype=torch.int32, device=self.device),
                         arrivals=torch.zeros(1, dtype=torch.int32, device=self.device),
                         attention_partial=torch.empty(attention_partials(batch, net.n_head, net.head_dim, shares), **f32),
                         attention_arrivals=torch.zeros(batch, net.n_head, dtype=torch.int32, device=self.device))
        return s

    def reads_from_first(self, length: int) -> bool:
        """A cache wider than the context is the serving scheduler's, mostly empty, its rows starting at
        different slots: each row's attention reads from its first (docs/journal/performance.md)."""
        return length > self.n_positions

    def prepare_steps(self, s: CacheSlot) -> None:
        """The first fused step's input; greedy_advance and the sampler's advance write each later step's."""
        embed(s.token, s.position, self.net.wte, self.net.wpe, s.scratch["x"])

    def greedy_step(self, s: CacheSlot) -> None:
        """As StaticCacheBackend.greedy_step, in one launch after the step's: the LM head leaves each
        program's row maxima, and greedy_advance picks the token, moves every input on and embeds
        the next step's input: one launch less a step."""
        net, b = self.net, s.scratch
        self.decode_step(s, argmax=(b["best"], b["best_index"]), embedded=True)
        greedy_advance(b["best"], b["best_index"], s.token, s.greedy_tokens, s.step, s.position, s.advance, s.start,
                       s.slot_mask, b["arrivals"], embedding=(net.wte, net.wpe, b["x"]), pdl=self.pdl_capable)

    def sampled_step(self, s: CacheSlot) -> None:
        """As StaticCacheBackend.sampled_step, in two launches after the step's: the sampler draws each
        row's token from the logits and does greedy_advance's work."""
        net, b = self.net, s.scratch
        logits = self.decode_step(s, embedded=True)
        sample_rows(logits, s.sampling, s.position, advance=dict(
            token=s.token, tokens=s.greedy_tokens, step=s.step, advance=s.advance, start=s.start, slot_mask=s.slot_mask,
            arrivals=b["arrivals"], wte=net.wte, wpe=net.wpe, x=b["x"]), pdl=self.pdl_capable)

    def decode_step(self, s: CacheSlot, argmax: tuple[torch.Tensor, torch.Tensor] | None = None,
                    embedded: bool = False) -> torch.Tensor | None:
        """As StaticCacheBackend.decode_step; with argmax (greedy_step) only the LM head's maxima, no
        logits; embedded: the residual stream already holds this step's input embedding."""
        net, b = self.net, s.scratch
        x, q, attention, hidden = b["x"], b["q"], b["attention"], b["hidden"]
        pdl = self.pdl_capable  # every launch but the embedding, which follows the host's copies
        early = pdl and self.streams_weights(len(s.token))
        if not embedded:
            embed(s.token, s.position, net.wte, net.wpe, x)
        # the QKV and fc products' input normalised first
        apart = layer_norms_apart(len(s.token), net.n_embd, self.decode_weights.narrow)
        normed, norm = (b["normalized"], {}) if apart else (x, {"ln": net.eps})
        for i in range(net.n_layer):
            keys, values = s.cache[2 * i], s.cache[2 * i + 1]
            if apart:
                layer_norm(x, normed, net.eps, pdl=pdl)
            # early at every batch: attention requests most of the cache before its wait
            self.linear(normed, "qkv", i, q, bias=net.qkv_b[i], qkv=(keys, values, s.start, net.head_dim),
                        pdl=pdl, early=pdl, **norm)
            decode_attention(q, keys, values, s.slot_mask, s.start, attention, b["attention_partial"],
                             b["attention_arrivals"], pdl=pdl, early=early,
                             first=self.attention_first(s), anchored=self.row_local)
            self.linear(attention, "proj", i, x, bias=net.proj_b[i], residual=True, pdl=pdl, early=early)
            if apart:
                layer_norm(x, normed, net.eps, pdl=pdl)
            self.linear(normed, "fc", i, hidden, bias=net.fc_b[i], gelu=True, pdl=pdl, early=early, **norm)
            self.linear(hidden, "fc2", i, x, bias=net.fc2_b[i], residual=True, pdl=pdl, early=early)
        # a greedy step keeps only each program's maxima: nothing reads its logits
        logits = b["logits"] if argmax is None else None
        norm = {"ln": net.eps}
        head_x = x
        if head_normalized_apart(len(s.token)):
            layer_norm(x, b["normalized"], net.eps, pdl=pdl)
            head_x, norm = b["normalized"], {}
        self.linear(head_x, "head", None, logits, bias=net.head_b, n=self.vocab_size, argmax=argmax, pdl=pdl,
                    early=early, **norm)
        return logits


# the float type each precision's decode computes in: int8-wo reads int8 weights and computes in fp16
ACTIVATIONS = {"fp32": "fp32", "fp16": "fp16", "int8-wo": "fp16"}


def int8_matrices(net, int8: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
    """int8-wo: every product's float weights of StaticGPT2 replaced by the int8 ones with their scales
    (int8_weights), which the prefill's products (int8_products) and the decode step's both read, so no
    float copy of the matrices is held; the token embedding stays float (the head has its own copy)."""
    for name in MATRICES:
        q, scale = int8[name]
        rows, device = getattr(net, f"{name}_w").shape[0], net.wte.device
        delattr(net, f"{name}_w")  # the float matrix's last reference
        if name == "head":  # StaticGPT2 pads the head's rows (VOCAB_ALIGN): zero rows, scale 1
            q, scale = F.pad(q, (0, 0, 0, rows - q.shape[0])), F.pad(scale, (0, rows - q.shape[0]), value=1.0)
        setattr(net, f"{name}_w", RowScaled(q.to(device).contiguous(), scale.to(device, torch.float32).contiguous()))
    net.prefill_ops = Int8WeightOps
    if net.wte.device.type == "cuda":
        torch.cuda.empty_cache()  # the float matrices' memory back to the device, not held by the allocator


MATRICES = ("qkv", "proj", "fc", "fc2", "head")


class DecodeWeights:
    """The decode step's weights, each with what its fused linear takes besides: the float weights
    (StaticGPT2's, layer norms folded in), or in int8-wo the int8 ones with a scale per output
    (int8_matrices), and for the products after a layer norm each output's weights summed (the tiles
    normalise after the product: _tile_product)."""

    def __init__(self, net):
        self.narrow = isinstance(net.qkv_w, RowScaled)  # one-byte weights: their own tiles (linear_config)
        self.weights: dict[str, tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]] = {}
        for name in MATRICES:
            w = getattr(net, f"{name}_w")
            if isinstance(w, RowScaled):
                # each output's real weights summed: its integers' sum (exact in fp32) times its scale
                self.weights[name] = (w.q, w.scale, w.q.sum(-1, dtype=torch.float32) * w.scale)
            else:
                w = w.detach()
                self.weights[name] = (w, None, w.sum(-1, dtype=torch.float32))

    def of(self, name: str, layer: int | None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        w, scale, sums = self.weights[name]
        if layer is None:
            return w, scale, sums
        return w[layer], None if scale is None else scale[layer], sums[layer]
