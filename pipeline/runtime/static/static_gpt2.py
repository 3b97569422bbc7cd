"""GPT-2's forward over a static KV cache, written for speed: the weights of a Hugging Face
checkpoint in a few contiguous tensors, the cache one preallocated buffer written in place, and
a decode step whose tensor shapes never change, so torch.compile and CUDA graphs can take it.

Cache slots are columns of the (left-padded) batch: slot t holds the keys/values of column t.
A query at column c attends to the slots t <= c whose attention-mask entry is 1.

The tied embedding is stored with its rows padded to a multiple of 64: cuBLAS falls back to slow
kernels for an LM head 50257 columns wide (a misaligned row stride)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import GPT2LMHeadModel

from pipeline.int8_weights import fold_layer_norm
from pipeline.runtime.kernels.torch_ops import TorchOps

VOCAB_ALIGN = 64


class StaticGPT2(torch.nn.Module):
    def __init__(self, hf: GPT2LMHeadModel, dtype: torch.dtype, fold_layer_norms: bool = False,
                 prefill_ops: type = TorchOps):
        """fold_layer_norms: each layer norm's weight and bias are folded (in fp32, before the cast to
        dtype) into the product after it, and the norms left as the identity affine; the LM head then
        gets its own copy of the tied embedding. Same function; a kernel that fuses the norm into the
        product then loads no weight or bias of the norm's. prefill_ops: what a prefill's elementwise
        work runs as (TorchOps' operations; the decode step always takes TorchOps)."""
        super().__init__()
        self.prefill_ops = prefill_ops
        c = hf.config
        self.n_layer, self.n_head, self.n_embd = c.n_layer, c.n_head, c.n_embd
        self.head_dim, self.eps = c.n_embd // c.n_head, c.layer_norm_epsilon
        t = hf.transformer
        as_param = lambda x: torch.nn.Parameter(x.to(dtype).contiguous(), requires_grad=False)  # noqa: E731
        stack = lambda get: torch.stack([get(block).detach().float() for block in t.h])  # noqa: E731
        self.vocab_size = c.vocab_size
        padded = F.pad(t.wte.weight.detach().float(), (0, 0, 0, -c.vocab_size % VOCAB_ALIGN))  # zero rows: sliced off
        self.wte, self.wpe = as_param(padded), as_param(t.wpe.weight.detach())
        # Conv1D stores [in, out]; F.linear wants [out, in]
        ln1 = stack(lambda b: b.ln_1.weight), stack(lambda b: b.ln_1.bias)
        ln2 = stack(lambda b: b.ln_2.weight), stack(lambda b: b.ln_2.bias)
        lnf = t.ln_f.weight.detach().float(), t.ln_f.bias.detach().float()
        qkv = stack(lambda b: b.attn.c_attn.weight.t()), stack(lambda b: b.attn.c_attn.bias)
        fc = stack(lambda b: b.mlp.c_fc.weight.t()), stack(lambda b: b.mlp.c_fc.bias)
        if fold_layer_norms:  # the tied LM head, bias-free, gets a copy of its own with ln_f in it
            head = fold_layer_norm(padded, torch.zeros(len(padded)), *lnf)
            qkv, fc = fold_layer_norm(*qkv, *ln1), fold_layer_norm(*fc, *ln2)
            ln1, ln2, lnf = ((torch.ones_like(w), torch.zeros_like(b)) for w, b in (ln1, ln2, lnf))
        self.ln1_w, self.ln1_b = map(as_param, ln1)
        self.qkv_w, self.qkv_b = map(as_param, qkv)
        self.proj_w = as_param(stack(lambda b: b.attn.c_proj.weight.t()))
        self.proj_b = as_param(stack(lambda b: b.attn.c_proj.bias))
        self.ln2_w, self.ln2_b = map(as_param, ln2)
        self.fc_w, self.fc_b = map(as_param, fc)
        self.fc2_w = as_param(stack(lambda b: b.mlp.c_proj.weight.t()))
        self.fc2_b = as_param(stack(lambda b: b.mlp.c_proj.bias))
        self.lnf_w, self.lnf_b = map(as_param, lnf)
        self.head_w, self.head_b = map(as_param, head) if fold_layer_norms else (self.wte, None)
        # [2L + 1, C]: the k-th holds the first k of proj_b, fc2_b, proj_b, ... summed once here, since
        # summing them in the forward would put a launch before each layer norm
        if prefill_ops.defers_residual_biases:
            added = torch.stack([self.proj_b, self.fc2_b], 1).flatten(0, 1).float().cumsum(0)
            self.register_buffer("residual_biases", F.pad(added, (0, 0, 1, 0)), persistent=False)

    def new_cache(self, batch: int, max_len: int, one_buffer: bool = False) -> list[torch.Tensor] | torch.Tensor:
        """2L tensors [B, H, T, D] (layer i's keys at 2i, values at 2i + 1), zeroed so unused slots
        hold finite values; with one_buffer, one tensor [2L, B, H, T, D]. Separate tensors by default:
        torch.compile turns an in-place write into a view of a graph input into a copy of the whole
        base buffer, which at batch 64 costs more than the step itself."""
        shape = (batch, self.n_head, max_len, self.head_dim)
        if one_buffer:
            return torch.zeros(2 * self.n_layer, *shape, dtype=self.wte.dtype, device=self.wte.device)
        return [torch.zeros(shape, dtype=self.wte.dtype, device=self.wte.device) for _ in range(2 * self.n_layer)]

    def prefill(self, input_ids: torch.Tensor, position_ids: torch.Tensor, slot_mask: torch.Tensor,
                cache: list[torch.Tensor], start: int = 0, last_only: bool = False, causal: bool = False) -> torch.Tensor:
        """input_ids/position_ids [B, S] into slots start.. start + S; slot_mask [B, T] bool (which cache
        slots are real tokens); cache as new_cache(). causal: a prefill from slot 0 whose rows have no
        padding, so attention is plain causal and needs no mask (SDPA's causal flash kernel runs at
        about half the masked kernel's time: docs/journal/performance.md), and every position is its slot:
        neither slot_mask nor position_ids is read. -> logits [B, S, V], or [B, 1, V] with last_only"""
        B, S = input_ids.shape
        if causal and start:
            raise ValueError("causal needs a prefill from slot 0: its queries and keys are then the same slots")
        T = start + S  # the slots after the prompt's hold nothing yet: attention reads only up to them
        slots = start + torch.arange(S, device=input_ids.device)  # [S]
        allowed = None if causal else self.allowed_slots(slots, slot_mask, T)
        ops = self.prefill_ops
        positions = slots.expand(B, S) if causal else position_ids
        # the residual products' biases that the stream lacks at each layer norm, where ops defers them
        owed = self.residual_biases if ops.defers_residual_biases else None
        x, h = ops.embed_layer_norm(self.wte, self.wpe, input_ids, positions, self.ln1_w[0], self.ln1_b[0], self.eps)
        for i in range(self.n_layer):
            if i:
                h = ops.layer_norm(x, owed_at(owed, 2 * i), self.ln1_w[i], self.ln1_b[i], self.eps)
            qkv = ops.linear(h, self.qkv_w[i], self.qkv_b[i])  # [B, S, 3C]
            keys, values = cache[2 * i], cache[2 * i + 1]
            last = last_only and i == self.n_layer - 1
            if causal and not last:
                a = ops.causal_attention(qkv, keys, values)
            else:
                ops.write_cache(qkv, keys, values, start, slots)
                q, mask = self.queries(qkv), allowed
                if last:
                    # every position's keys and values are cached by now, and only the last position's
                    # output is read: the last layer's attention, projection and MLP run for it alone
                    # (a single last query sees every slot up to its own: no mask where causal)
                    q, x = q[:, :, -1:], x[:, -1:]
                    mask = None if causal else allowed[:, :, -1:]
                a = self.attend(q, keys[:, :, :T], values[:, :, :T], mask)
            x = self.after_attention(ops, x, a, i, owed)
        return self.head(ops, x, owed)

    def decode_step(self, token: torch.Tensor, position: torch.Tensor, slot_mask: torch.Tensor, start: torch.Tensor,
                    cache: list[torch.Tensor], first: list[int | None] | None = None) -> torch.Tensor:
        """token/position [B, 1] into slot `start`, a scalar int64 tensor so that one graph serves every
        slot; attention masks the whole cache (slot_mask [B, T]). With `first` (each row's first filled
        slot, None for a row that computes for nothing), each row's attention runs alone over its own
        slots first[b] .. start (attend_rows). -> logits [B, 1, V]"""
        T = cache[0].shape[2]
        slots = start + torch.arange(1, device=token.device)  # [1]
        allowed = self.allowed_slots(slots, slot_mask, T)
        last = int(start) if first is not None else 0
        x, h = TorchOps.embed_layer_norm(self.wte, self.wpe, token, position, self.ln1_w[0], self.ln1_b[0], self.eps)
        for i in range(self.n_layer):
            if i:
                h = TorchOps.layer_norm(x, None, self.ln1_w[i], self.ln1_b[i], self.eps)
            qkv = F.linear(h, self.qkv_w[i], self.qkv_b[i])  # [B, 1, 3C]
            keys, values = cache[2 * i], cache[2 * i + 1]
            TorchOps.write_cache(qkv, keys, values, start, slots)
            q = self.queries(qkv)
            a = (self.attend(q, keys, values, allowed) if first is None
                 else self.attend_rows(q, keys, values, allowed, first, last))
            x = self.after_attention(TorchOps, x, a, i, None)
        return self.head(TorchOps, x, None)

    def attend_rows(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, allowed: torch.Tensor,
                    first: list[int | None], last: int) -> torch.Tensor:
        """attend() of each row alone over its slots first[b] .. last (zeros where first[b] is None): what
        a row computes then depends on its own slots only, not on where in the cache they sit or on which
        rows run beside it (a reduction over the whole cache groups a row's slots by their columns)."""
        out = q.new_zeros(q.shape[0], 1, self.n_embd)
        for b, f in enumerate(first):
            if f is not None:
                out[b:b + 1] = self.attend(q[b:b + 1], keys[b:b + 1, :, f:last + 1], values[b:b + 1, :, f:last + 1],
                                           allowed[b:b + 1, :, :, f:last + 1])
        return out

    @staticmethod
    def allowed_slots(slots: torch.Tensor, slot_mask: torch.Tensor, T: int) -> torch.Tensor:
        """[B, 1, S, T]: each query at slots [S] sees the real slots up to its own, and always itself (no empty rows)."""
        t = torch.arange(T, device=slots.device)
        return (((t[None, :] <= slots[:, None])[None] & slot_mask[:, None, :T]) | (t[None, :] == slots[:, None])[None])[:, None]

    def queries(self, qkv: torch.Tensor) -> torch.Tensor:
        """qkv [B, S, 3C] -> the queries [B, H, S, D]."""
        B, S, _ = qkv.shape
        return qkv.view(B, S, 3, self.n_head, self.head_dim)[:, :, 0].transpose(1, 2)

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Attention of q [B, H, S, D] over the cache's keys and values [B, H, T, D] -> [B, S, C]."""
        a = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return a.transpose(1, 2).reshape(q.shape[0], q.shape[2], self.n_embd)

    def after_attention(self, ops, x: torch.Tensor, a: torch.Tensor, i: int, owed: torch.Tensor | None) -> torch.Tensor:
        """Layer i after its attention a: the projection added to the stream x, then the MLP's residual."""
        x = ops.add_linear(x, a, self.proj_w[i], product_bias(owed, self.proj_b[i]))
        h = ops.layer_norm(x, owed_at(owed, 2 * i + 1), self.ln2_w[i], self.ln2_b[i], self.eps)
        return ops.add_linear(x, ops.linear_gelu(h, self.fc_w[i], self.fc_b[i]), self.fc2_w[i],
                              product_bias(owed, self.fc2_b[i]))

    def head(self, ops, x: torch.Tensor, owed: torch.Tensor | None) -> torch.Tensor:
        h = ops.layer_norm(x, owed_at(owed, 2 * self.n_layer), self.lnf_w, self.lnf_b, self.eps)
        return ops.linear(h, self.head_w, self.head_b)[..., :self.vocab_size]


def owed_at(owed: torch.Tensor | None, k: int) -> torch.Tensor | None:
    """What the residual stream lacks at the k-th layer norm (StaticGPT2.residual_biases), if deferred."""
    return None if owed is None else owed[k]


def product_bias(owed: torch.Tensor | None, bias: torch.Tensor) -> torch.Tensor | None:
    """A residual product's own bias, unless the layer norms after it add it (owed)."""
    return bias if owed is None else None
