"""#74's scoring on the GPU, on a random GPT-2 124M without a run folder: `echo` + `logprobs` of one
512-token prompt through the triton backend's own prefill (Backend.sequence_logits, what the engine
scores with) and through the eager scorer it replaced, against the prefill of that prompt alone
(its captured graph, last position only); medians of 20, ms. Also the two scorers' agreement.
    python docs/journal/probes/scoring_gpu/score_time.py"""

import statistics
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from pipeline.runtime.batch import left_pad
from pipeline.runtime.scoring import Scorer, eager_logits
from pipeline.runtime.static.triton_backend import TritonBackend


def median_ms(fn, runs: int = 20) -> float:
    fn()
    times = []
    for _ in range(runs):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).eval()
    cuda = torch.device("cuda")
    sequence = torch.randint(0, 50257, (512,)).tolist()
    backend = TritonBackend(model, "fp16", "cuda")
    batch = left_pad([sequence], 0, cuda)
    backend.reset(1, 513)
    prefill = median_ms(lambda: backend.prefill(batch))
    own = Scorer(backend.sequence_logits)
    eager = Scorer(eager_logits(model, cuda, torch.float16))  # the backend holds its own copy of the weights
    ms = {name: median_ms(lambda s=s: s.score([sequence], [1], top=1)) for name, s in (("own", own), ("eager", eager))}
    print(f"prefill 1x512 {prefill:.3f} ms | own scoring {ms['own']:.3f} ms ({ms['own'] / prefill:.2f}x) | "
          f"eager scoring {ms['eager']:.3f} ms ({ms['eager'] / prefill:.2f}x)")
    a, b = (s.score([sequence], [1], top=1)[0] for s in (own, eager))
    gap = max(abs(x - y) for x, y in zip(a.token_logprobs, b.token_logprobs))
    same = sum(x[0][0] == y[0][0] for x, y in zip(a.top, b.top)) / len(a.top)
    print(f"own against eager: largest logprob gap {gap:.2e}, same top-1 {same:.3f}")


if __name__ == "__main__":
    main()
