"""Hand-written Triton kernels for the triton backend. One GPT-2 decode step is five launches per layer
(linear_kernels, decode_attention), its tail one more (step_tail), or two that sample (sampling_kernels);
the prefill has kernels of its own (prefill_kernels; in int8-wo its products read the int8 weights,
int8_products), and the tiles each launch takes are data (tiles).

At batch 1 to 64 a decode step is bound by kernel launches and by reading the weights once, not by
arithmetic: cuBLAS plus Inductor spend about 11 kernels per layer (layer norms, GEMMs, bias, GELU,
cache writes, split-K reductions, attention), each a few microseconds. Here each layer is:

1. fused_linear(LN1 -> QKV, bias), whose epilogue writes q to a buffer and k/v straight into the
   static cache at the step's slot;
2. decode_attention: one query per (row, head) against the cache with an online softmax, reading
   only the slots up to the step's slot (the filled part of the cache), whatever the cache length;
   at small batch each (row, head) is split over several programs whose last one merges them;
3. fused_linear(attention -> proj, bias, += residual);
4. fused_linear(LN2 -> fc, bias, GELU);
5. fused_linear(fc -> proj, bias, += residual).

fused_linear runs one row as row products (each program a few output columns, its whole K slice
loaded at once: at batch 1 what counts is how many weight bytes are in flight) and more rows as
narrow tensor-core tiles; a layer norm before a product is fused into it, its weight and bias
folded into the product's (the tiles apply it after the product, so that no pass over x holds the
weights back: _tile_product), except above 16 rows before the LM head and, from 1,024 wide, before
QKV and fc, where one small launch normalises x first (layer_norm, head_normalized_apart,
layer_norms_apart). The residual stream is kept in fp32 between kernels; weights, cache and
activations that feed a matrix product are in the model's dtype. The step's slot is read from a
device scalar, so one CUDA graph of these launches serves every step. For greedy decoding the LM head also leaves each
program's row maxima and greedy_advance turns them into the next token and the next step's inputs,
one more launch in place of the host's argmax and input copies.

With pdl (programmatic dependent launch, Hopper and later) a launch may start while the one before
it is still running: each program requests what no launch of this step writes (weights, biases, the
step's slot and counters, the cache slots of earlier steps) first, waits (gdc_wait) before it reads
anything the step writes or writes anything itself, and lets the next launch start
(gdc_launch_dependents) once its own loads are done, so the next launch's programs take
multiprocessors as this one's free them; or, with early, as soon as it starts, where the next
launch has loads of its own to make before its wait: attention's cache after the QKV launch, and
at batch 1 every row product's weight slice, so that the weights of launches to come stream in
while earlier ones compute. A wait returns once the launch before has completed, which it can only
do after its own wait, so every launch before that one has completed too; and what a program
reads before its wait was written before the step began."""
