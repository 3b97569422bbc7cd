"""GPU time of the continuous scheduler's pieces at 64 rows (triton fp16, GPT-2 124M shape, random
weights): the decode step at several columns of its wide cache, join prefills, a finished row's
cache move; then the triton decode's logits against the static model's torch ops in that cache.
From the repository root on a GPU: `PYTHONPATH=. python artifacts/results/serve_h200_join_gather/scheduler_probe.py`."""
import time, torch
from transformers import GPT2Config, GPT2LMHeadModel
from pipeline.runtime.static.triton_backend import TritonBackend
from pipeline.runtime.scheduler import ContinuousScheduler
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config()).eval()
be = TritonBackend(model, "fp16", "cuda")
t = time.perf_counter(); sch = ContinuousScheduler(be, pad_id=0, max_rows=64); sch.warm_up(); print(f"warm_up {time.perf_counter()-t:.1f}s", flush=True)
def gpu_ms(fn, n=100):
    fn(); torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n): fn()
    b.record(); torch.cuda.synchronize(); return a.elapsed_time(b) / n
tok = torch.zeros(64, 1, dtype=torch.long); pos = torch.full((64, 1), 200, dtype=torch.long)
with torch.inference_mode():
    sch.batch.slot_mask[:, :2048] = True
    for col in (256, 512, 1024, 2000):
        sch.column = col
        print(f"decode b64 at column {col}: {gpu_ms(lambda: sch.decode(64, tok, pos)):.3f} ms", flush=True)
    sch.column = 300
    host = time.perf_counter()
    for _ in range(100): sch.decode(64, tok, pos).argmax(-1).tolist()
    print(f"decode b64 + argmax.tolist, host-timed: {(time.perf_counter()-host)*10:.3f} ms", flush=True)
    for rows in (1, 4, 16):
        prompts = [[100 + i] * 128 for i in range(rows)]
        print(f"prefill {rows} x 128: {gpu_ms(lambda: sch.prefill(prompts, sch.width_of(prompts)), 20):.3f} ms", flush=True)
    big = sch.batch.cache
    print(f"finish-style row move (all layers): {gpu_ms(lambda: [t_[3].copy_(t_[63]) for t_ in big], 50):.3f} ms; cache tensors {len(big)} x {tuple(big[0].shape)}", flush=True)
# correctness: triton (its decode attention) against the static model's torch ops, same fed tokens,
# a 2048-wide cache with ~300 filled slots at batch 64 and 2
from pipeline.runtime.static.torch_compiled import TorchCompiledBackend
from pipeline.runtime.batch import left_pad
ref = TorchCompiledBackend(model, "fp16", "cuda", compile=False)
with torch.inference_mode():
    for rows in (64, 2):
        prompts = [[(7 * i + j) % 50000 for j in range(200 + (i % 3))] for i in range(rows)]
        worst = 0.0
        for b in (be, ref):
            b.reset(rows, 2048)
        batch = left_pad(prompts, 0, torch.device("cuda"))
        la, lb = be.prefill(batch)[:, -1].float(), ref.prefill(batch)[:, -1].float()
        pos = batch.position_ids[:, -1:]
        for step in range(60):
            tokb = lb.argmax(-1, keepdim=True)
            pos = pos + 1
            la, lb = be.decode(tokb, pos).float(), ref.decode(tokb, pos).float()
            worst = max(worst, ((la - lb).abs().max() / lb.abs().max()).item())
        print(f"rows {rows}: worst relative logits error over 60 decode steps {worst:.2e}", flush=True)
