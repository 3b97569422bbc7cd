"""The generation runtime: backends that execute one forward on a KV cache, and the generator
(prefill, decode steps, sampling) that validate, bench and serve share."""
