"""int8-wo's prefill on its int8 weights, on a random GPT-2 124M without a run folder: the memory the
triton backend holds once open (fp16 against int8-wo), the prefill's time at 1 and 64 rows of 128
tokens (median of 20 replays of its graph), the prefill logits' error of int8-wo against fp16, and
whether 32 greedy tokens agree.
    python docs/journal/probes/launch_floor/int8_prefill.py"""

import statistics
import sys
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "shapes_h200"))
from graph_timing import open_triton  # noqa: E402

from pipeline.accuracy import compare_logits  # noqa: E402
from pipeline.runtime.batch import left_pad  # noqa: E402
from pipeline.runtime.generate import Generator  # noqa: E402
from pipeline.runtime.sampling import Sampling  # noqa: E402


def prefill_ms(backend, batch) -> float:
    backend.reset(batch.host.shape[1], 256)
    backend.prefill(batch)
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        backend.prefill(batch)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).eval()
    prompts = torch.randint(0, 50257, (64, 128)).tolist()
    results = {}
    for precision in ("fp16", "int8-wo"):
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        backend = open_triton(model, precision)
        held = (torch.cuda.memory_allocated() - base) / 2**20
        times = {rows: prefill_ms(backend, left_pad(prompts[:rows], 0, torch.device("cuda"))) for rows in (1, 64)}
        backend.reset(4, 256)
        logits = backend.prefill(left_pad(prompts[:4], 0, torch.device("cuda")), last_only=False).float().clone()
        tokens = Generator(backend, pad_id=0).generate(prompts[:4], Sampling(max_new_tokens=32))
        results[precision] = (logits, tokens)
        print(f"{precision}: holds {held:,.0f} MiB; prefill 1x128 {times[1]:.3f} ms, 64x128 {times[64]:.3f} ms", flush=True)
        del backend
    (a, ta), (b, tb) = results["fp16"], results["int8-wo"]
    same = sum(x == y for p, q in zip(ta, tb) for x, y in zip(p, q)) / sum(len(p) for p in ta)
    print(f"int8-wo prefill logits vs fp16: rel error {compare_logits(b, a)['rel_error']:.2e}; greedy tokens same {same:.3f}")


if __name__ == "__main__":
    main()
