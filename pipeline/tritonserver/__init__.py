"""Triton Inference Server: the model repository `package --format triton` writes, the generation
model that runs there on Triton's Python backend, and starting nvidia-pytriton's `tritonserver` on it.
(Triton the kernel language is another thing: `pipeline/runtime/kernels/`.)"""
