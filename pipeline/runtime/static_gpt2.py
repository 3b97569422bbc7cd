"""GPT-2's forward over a static KV cache, written for speed: the weights of a Hugging Face
checkpoint in a few contiguous tensors, the cache one preallocated buffer written in place, and
a decode step whose tensor shapes never change, so torch.compile and CUDA graphs can take it.

Cache slots are columns of the (left-padded) batch: slot t holds the keys/values of column t.
A query at column c attends to the slots t <= c whose attention-mask entry is 1.

The tied embedding is stored with its rows padded to a multiple of 64: cuBLAS falls back to slow
kernels for an LM head 50257 columns wide (a misaligned row stride), 7x slower at batch 64."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import GPT2LMHeadModel

VOCAB_ALIGN = 64


class TorchOps:
    """The elementwise work around the products, as PyTorch ops: what torch.compile fuses in the
    decode step, and the prefill of every backend but triton (prefill_kernels.TritonOps)."""

    # whether the residual products' biases are left out of the residual stream and added by each
    # layer norm instead (StaticGPT2.residual_biases): an ops class whose products add into the
    # stream in place can then skip writing the stream back in its layer norms
    defers_residual_biases = False

    @staticmethod
    def layer_norm(x: torch.Tensor, owed: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor,
                   eps: float) -> torch.Tensor:
        """layer_norm(x + owed): owed [C], where given, is what the residual stream x still lacks."""
        return F.layer_norm(x if owed is None else x + owed, x.shape[-1:], weight, bias, eps)

    @staticmethod
    def add_linear(x: torch.Tensor, a: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        """The residual add of a product: x + a @ w^T (+ b)."""
        return x + F.linear(a, w, b)

    @staticmethod
    def embed_layer_norm(wte: torch.Tensor, wpe: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor,
                         weight: torch.Tensor, bias: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """The first layer norm over the embedded input: (x, layer_norm(x)) for x = wte[ids] + wpe[positions]."""
        x = wte[ids] + wpe[positions]
        return x, TorchOps.layer_norm(x, None, weight, bias, eps)

    @staticmethod
    def causal_attention(qkv: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """A prefill from slot 0 without padding: the keys and values of qkv [B, S, 3C] into slots 0..S
        of the caches [B, H, T, D], and plain causal attention over them -> [B, S, C]."""
        batch, seq, width = qkv.shape
        _, heads, _, head_dim = keys.shape
        TorchOps.write_cache(qkv, keys, values, 0, None)
        q = qkv.view(batch, seq, 3, heads, head_dim)[:, :, 0].transpose(1, 2)  # [B, H, S, D]
        a = F.scaled_dot_product_attention(q, keys[:, :, :seq], values[:, :, :seq], is_causal=True)
        return a.transpose(1, 2).reshape(batch, seq, width // 3)

    @staticmethod
    def linear_gelu(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.gelu(F.linear(h, w, b), approximate="tanh")

    @staticmethod
    def write_cache(qkv: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: torch.Tensor | int,
                    slots: torch.Tensor | None) -> None:
        """The keys and values of qkv [B, S, 3C] into the caches [B, H, T, D] at slots (start.. start + S;
        slots, the same as a tensor, is read only where start is one)."""
        batch, seq, _ = qkv.shape
        _, heads, _, head_dim = keys.shape
        k, v = qkv.view(batch, seq, 3, heads, head_dim)[:, :, 1:].permute(2, 0, 3, 1, 4)  # [B, H, S, D] each
        if isinstance(start, int):  # a slice copy: index_copy_ from these strided views is 3x slower
            keys[:, :, start:start + seq].copy_(k)
            values[:, :, start:start + seq].copy_(v)
        else:
            keys.index_copy_(2, slots, k)
            values.index_copy_(2, slots, v)


def fold_layer_norm(w: torch.Tensor, b: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor):
    """The layer norm's affine part folded into the linear layer after it (w [..., N, K], b [..., N],
    gamma and beta [..., K]): (n * gamma + beta) @ w^T + b == n @ (w * gamma)^T + (w @ beta + b)."""
    return w * gamma[..., None, :], b + (w @ beta[..., :, None])[..., 0]


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

    def new_cache(self, batch: int, max_len: int) -> list[torch.Tensor]:
        """2L tensors [B, H, T, D] (layer i's keys at 2i, values at 2i + 1), zeroed so unused slots
        hold finite values. Separate tensors, not views of one buffer: torch.compile turns an
        in-place write into a view of a graph input into a copy of the whole base buffer, which at
        batch 64 costs more than the step itself."""
        return [torch.zeros(batch, self.n_head, max_len, self.head_dim, dtype=self.wte.dtype, device=self.wte.device)
                for _ in range(2 * self.n_layer)]

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, slot_mask: torch.Tensor,
                start: torch.Tensor | int, cache: list[torch.Tensor], last_only: bool = False,
                causal: bool = False) -> torch.Tensor:
        """input_ids/position_ids [B, S]; slot_mask [B, T] bool (which cache slots are real tokens);
        start: the first slot written, an int (a prefill) or a scalar int64 tensor (a decode step,
        whose one graph then serves every slot); cache as new_cache(). causal: a prefill from slot 0
        whose rows have no padding, so that attention is plain causal and needs no mask
        (ops.causal_attention: SDPA's causal flash kernel took 23 against 45 us a layer with the mask
        on an H200 at batch 64 x 128 tokens, 8.7 against 18.5 at batch 1), and every position is its
        slot: neither slot_mask nor position_ids is read. -> logits [B, S or 1, V]"""
        B, S = input_ids.shape
        prefill = isinstance(start, int)  # a decode step's start is a tensor: one graph for every slot
        if causal and not (prefill and start == 0):
            raise ValueError("causal needs a prefill from slot 0: its queries and keys are then the same slots")
        # a prefill's slots past its own hold nothing yet: attention reads only up to them (a decode
        # step masks the whole cache instead)
        T = start + S if prefill else cache[0].shape[2]
        slots = start + torch.arange(S, device=input_ids.device)  # [S]
        # [B, 1, S, T]: causal over slots, real tokens only; a query always sees itself (no empty rows)
        allowed = None
        if not causal:
            t = torch.arange(T, device=input_ids.device)
            allowed = (((t[None, :] <= slots[:, None])[None] & slot_mask[:, None, :T])
                       | (t[None, :] == slots[:, None])[None])[:, None]
        ops = self.prefill_ops if prefill else TorchOps
        positions = slots.expand(B, S) if causal else position_ids
        # owed[k]: the residual products' biases that the stream x lacks at the k-th layer norm, where
        # ops defers them (then each product gets no bias of its own)
        owed = self.residual_biases if ops.defers_residual_biases else None
        owed_at = lambda k: None if owed is None else owed[k]  # noqa: E731
        product_bias = lambda b: b if owed is None else None  # noqa: E731
        x, h = ops.embed_layer_norm(self.wte, self.wpe, input_ids, positions, self.ln1_w[0], self.ln1_b[0], self.eps)
        for i in range(self.n_layer):
            if i:
                h = ops.layer_norm(x, owed_at(2 * i), self.ln1_w[i], self.ln1_b[i], self.eps)
            qkv = F.linear(h, self.qkv_w[i], self.qkv_b[i])  # [B, S, 3C]
            keys, values = cache[2 * i], cache[2 * i + 1]
            last = last_only and i == self.n_layer - 1
            if causal and not last:
                a = ops.causal_attention(qkv, keys, values)
            else:
                ops.write_cache(qkv, keys, values, start, slots)
                q = qkv.view(B, S, 3, self.n_head, self.head_dim)[:, :, 0].transpose(1, 2)  # [B, H, S, D]
                mask = allowed
                if last:
                    # every position's keys and values are cached by now, and only the last position's
                    # output is read: the last layer's attention, projection and MLP run for it alone
                    # (a single last query sees every slot up to its own: no mask where causal)
                    q, x = q[:, :, -1:], x[:, -1:]
                    mask = None if causal else allowed[:, :, -1:]
                a = F.scaled_dot_product_attention(q, keys[:, :, :T], values[:, :, :T], attn_mask=mask)
                a = a.transpose(1, 2).reshape(B, q.shape[2], self.n_embd)  # [B, S or 1, C]
            x = ops.add_linear(x, a, self.proj_w[i], product_bias(self.proj_b[i]))
            h = ops.layer_norm(x, owed_at(2 * i + 1), self.ln2_w[i], self.ln2_b[i], self.eps)
            x = ops.add_linear(x, ops.linear_gelu(h, self.fc_w[i], self.fc_b[i]), self.fc2_w[i],
                               product_bias(self.fc2_b[i]))
        h = ops.layer_norm(x, owed_at(2 * self.n_layer), self.lnf_w, self.lnf_b, self.eps)
        return F.linear(h, self.head_w, self.head_b)[..., :self.vocab_size]
