"""The draw alone: an older sampler.py (argv[1]) against this tree's. First the tokens each gives over
random batches of settings and vocabularies (they must be the same), then each one's time a call at 8
rows of 50,257 on one thread, as a CPU's bench runs it (ONNX Runtime holds the other cores).

    python docs/journal/probes/cpu_int8/sampler_ab.py OLD_SAMPLER_PY"""

import importlib.util
import random
import sys
import time

import torch

from pipeline.runtime import sampler as new
from pipeline.runtime.sampling import Sampling

spec = importlib.util.spec_from_file_location("sampler_old", sys.argv[1])
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)
CPU = torch.device("cpu")


def random_settings(rng: random.Random) -> list[Sampling]:
    out = []
    for _ in range(rng.randint(1, 12)):
        if rng.random() < 0.15:
            out.append(Sampling(repetition_penalty=rng.choice([1.0, 1.3])))  # greedy rows among the sampled
            continue
        out.append(Sampling(do_sample=True, temperature=rng.choice([0.05, 0.3, 0.7, 0.8, 1.0, 1.5]),
                            top_k=rng.choice([0, 0, 1, 2, 5, 50, 1000]), top_p=rng.choice([1.0, 1.0, 0.95, 0.9, 0.5, 0.1]),
                            repetition_penalty=rng.choice([1.0, 1.0, 1.2]), seed=rng.randrange(2**40)))
    return out


def same_tokens(batches: int = 300) -> tuple[int, int]:
    rng, rows, same = random.Random(0), 0, 0
    torch.manual_seed(0)
    for _ in range(batches):
        settings = random_settings(rng)
        n, vocab = len(settings), rng.choice([7, 100, 2048, 2049, 4173, 50257])
        logits = torch.randn(n, vocab) * rng.choice([0.5, 1, 3, 8])
        prompts = [[rng.randrange(vocab) for _ in range(4)] for _ in range(n)]
        tables = []
        for module in (old, new):
            table = module.SamplingTable.new(n, vocab, CPU)
            table.fill(list(range(n)), [(s, i % 2) for i, s in enumerate(settings)], prompts)
            tables.append(table)
        tables[1].ints.copy_(tables[0].ints)  # the unseeded rows drew their seeds apart
        positions = torch.tensor([rng.randrange(1000) for _ in range(n)])
        for step in range(2):  # the penalised rows' counts carry over
            a = old.sample_reference(logits, tables[0], positions + step)
            b = new.sample_reference(logits, tables[1], positions + step)
            rows, same = rows + n, same + int((a == b).sum())
        assert torch.equal(tables[0].counts, tables[1].counts)
    return same, rows


def ms_a_call(module, repeats: int = 40) -> float:
    n, vocab = 8, 50257
    table = module.SamplingTable.new(n, vocab, CPU)
    table.fill(list(range(n)), [(Sampling(do_sample=True, temperature=0.8, top_p=0.95), 0)] * n, [[1]] * n)
    logits, positions = torch.randn(n, vocab) * 3, torch.full((n,), 130)
    for i in range(3):
        module.sample_reference(logits, table, positions + i)
    start = time.perf_counter()
    for i in range(repeats):
        module.sample_reference(logits, table, positions + i)
    return (time.perf_counter() - start) / repeats * 1e3


if __name__ == "__main__":
    same, rows = same_tokens()
    print(f"same token in {same} of {rows} rows")
    torch.set_num_threads(1)
    for name, module in (("old", old), ("new", new), ("old", old), ("new", new)):
        print(f"{name} {ms_a_call(module):.2f} ms a call, 8 rows, 1 thread")
