"""Hand-written kernels: the prefill is StaticGPT2's forward in a CUDA graph per prompt shape, with
its elementwise work fused (prefill_kernels); each decode step is five Triton kernels per layer
(triton_kernels) captured into one CUDA graph, with attention that reads only the filled part of
the cache; a greedy step adds one launch that picks the token from the LM head's per-program
maxima, advances the step's inputs and embeds the next step's token; a sampled step, one that draws
each row's token from the logits by its settings (sampling_kernels) and does the same."""

from __future__ import annotations

import torch

from pipeline.runtime.backend import BackendUnavailable
from pipeline.runtime.kernels.prefill_kernels import TritonOps
from pipeline.runtime.kernels.sampling_kernels import sample_rows
from pipeline.runtime.kernels.triton_kernels import (
    argmax_partials,
    attention_config,
    attention_partials,
    decode_attention,
    embed,
    fused_linear,
    greedy_advance,
    head_normalized_apart,
    layer_norm,
)
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

    def __init__(self, model, precision: str = "fp16", device="cuda", cuda_graphs: bool | None = None):
        head_dim = model.config.n_embd // model.config.n_head
        if head_dim & (head_dim - 1):  # the attention kernel holds one head in a power-of-two block
            raise BackendUnavailable(f"triton needs a power-of-two head size; this model's is {head_dim}")
        super().__init__(model, precision, device, cuda_graphs)
        # what the fused layer norms take besides the folded weights: each output's weights summed
        net = self.net
        self.qkv_sums, self.fc_sums, self.head_sums = (w.float().sum(-1) for w in (net.qkv_w, net.fc_w, net.head_w))
        # programmatic dependent launch (triton_kernels' docstring) needs Hopper's griddepcontrol
        self.pdl_capable = self.device.type == "cuda" and torch.cuda.get_device_capability(self.device) >= (9, 0)

    def streams_weights(self, batch: int) -> bool:
        """Whether every launch lets the next start at once (triton_kernels' docstring: early) rather
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
        partials = argmax_partials(batch, self.vocab_size, net.n_embd)  # greedy_step's argmax, in two stages
        shares = attention_config(batch, filled=self.reads_from_first(length))
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
        """As StaticCacheBackend.sampled_step, in one launch after the step's: the sampler draws each
        row's token from the logits and does greedy_advance's work."""
        net, b = self.net, s.scratch
        logits = self.decode_step(s, embedded=True)
        sample_rows(logits, s.sampling, s.position, advance=dict(
            token=s.token, tokens=s.greedy_tokens, step=s.step, advance=s.advance, start=s.start, slot_mask=s.slot_mask,
            arrivals=b["arrivals"], wte=net.wte, wpe=net.wpe, x=b["x"]))

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
        for i in range(net.n_layer):
            keys, values = s.cache[2 * i], s.cache[2 * i + 1]
            # early at every batch: attention requests most of the cache before its wait
            fused_linear(x, net.qkv_w[i], q, net.qkv_b[i], ln=(self.qkv_sums[i], net.eps),
                         qkv=(keys, values, s.start, net.head_dim), pdl=pdl, early=pdl)
            decode_attention(q, keys, values, s.slot_mask, s.start, attention, b["attention_partial"],
                             b["attention_arrivals"], pdl=pdl, early=early,
                             first=s.first if self.reads_from_first(keys.shape[2]) else None)
            fused_linear(attention, net.proj_w[i], x, net.proj_b[i], residual=True, pdl=pdl, early=early)
            fused_linear(x, net.fc_w[i], hidden, net.fc_b[i], ln=(self.fc_sums[i], net.eps), gelu=True, pdl=pdl,
                         early=early)
            fused_linear(hidden, net.fc2_w[i], x, net.fc2_b[i], residual=True, pdl=pdl, early=early)
        # a greedy step keeps only each program's maxima: nothing reads its logits
        logits = b["logits"] if argmax is None else None
        head_x, ln = x, (self.head_sums, net.eps)
        if head_normalized_apart(len(s.token)):
            layer_norm(x, b["normalized"], net.eps, pdl=pdl)
            head_x, ln = b["normalized"], None
        fused_linear(head_x, net.head_w, logits, net.head_b, ln=ln, n=self.vocab_size, argmax=argmax, pdl=pdl,
                     early=early)
        return logits
