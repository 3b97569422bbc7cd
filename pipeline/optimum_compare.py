"""This project's CPU backends against Optimum's best on the same checkpoint and the same prompts, in
alternated rounds: each round times one greedy generation of every row of ours at every batch, then
Optimum's (pipeline/optimum_worker.py, in Optimum's own environment: `make optimum-env`), so a slow
spell of the machine falls on both. tokens/s counts every generated token over the generation's wall
time, the prefill included, as a user of either measures it. Each ratio is the median over rounds of
a row's tokens/s over the other's in the same round.

    python -m pipeline.optimum_compare --run gpt2 --optimum-python .venv-optimum/bin/python
writes RUN/reports/optimum_compare.{json,md}. The run needs `export --target ort --precision fp32
--precision int8` first (the ort-fused rows)."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from pipeline.artifacts import RunDir, atomic_write_json, atomic_write_text
from pipeline.bench import timed_pass
from pipeline.bench_report import cpu_line
from pipeline.machine import environment, model_description, model_line
from pipeline.runtime.generate import Generator
from pipeline.runtime.loader import open_backend
from pipeline.runtime.sampling import Sampling

OURS = [("torch", "fp32"), ("ort-fused", "fp32"), ("ort-fused", "int8")]  # eager PyTorch first: the x eager base
WORKER = Path(__file__).with_name("optimum_worker.py")


class OptimumWorker:
    """Optimum's process: started and warmed up, then one round of timings per `round()`."""

    def __init__(self, python: str, checkpoint: Path, workdir: Path, prompts: Path, new_tokens: int, batches: list[int]):
        self.process = subprocess.Popen([python, str(WORKER), str(checkpoint), str(workdir), str(prompts), str(new_tokens),
                                         ",".join(map(str, batches))], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True)
        for line in self.process.stdout:
            if line.strip() == "ready":
                break
        else:
            raise RuntimeError(f"{WORKER.name} exited before it was ready (exit code {self.process.wait()}); its output is above")
        self.info = json.loads(self.process.stdout.readline())

    def round(self) -> dict[str, dict[str, float]]:
        self.process.stdin.write("round\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def close(self) -> None:
        self.process.stdin.write("quit\n")
        self.process.stdin.close()
        self.process.wait(60)


def compare(run: RunDir, optimum_python: str, batches: list[int], prompt_tokens: int, new_tokens: int, rounds: int) -> dict:
    cpu = torch.device("cpu")
    model = model_description(run.checkpoint)
    prompts = np.random.default_rng(0).integers(0, model["vocab"], (max(batches), prompt_tokens))
    run.reports.mkdir(parents=True, exist_ok=True)
    prompts_file = run.reports / "optimum_compare_prompts.npy"
    np.save(prompts_file, prompts)
    sampling = Sampling(max_new_tokens=new_tokens)
    ours = {f"{name} {precision}": open_backend(run, name, precision, cpu) for name, precision in OURS}
    for backend in ours.values():
        for batch in batches:
            timed_pass(Generator(backend), prompts[:batch], sampling, cpu)
    worker = OptimumWorker(optimum_python, run.checkpoint, run.root / "optimum", prompts_file, new_tokens, batches)
    passes: dict[str, dict[str, list[float]]] = {}
    try:
        for _ in range(rounds):
            for label, backend in ours.items():
                for batch in batches:
                    seconds = timed_pass(Generator(backend), prompts[:batch], sampling, cpu)[0]
                    passes.setdefault(label, {}).setdefault(str(batch), []).append(batch * new_tokens / seconds)
            for label, rates in worker.round().items():
                for batch, rate in rates.items():
                    passes.setdefault(label, {}).setdefault(batch, []).append(rate)
    finally:
        worker.close()
    result = {"settings": {"batches": batches, "prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "rounds": rounds},
              "model": model, "environment": environment(cpu), "optimum": worker.info,
              "rows": rows(passes, list(ours), worker.info["models"], batches)}
    atomic_write_json(run.reports / "optimum_compare.json", result)
    atomic_write_text(run.reports / "optimum_compare.md", markdown(result))
    return result


def rows(passes: dict, ours: list[str], theirs: list[str], batches: list[int]) -> list[dict]:
    """Each row's median tokens/s per batch, and its ratios per batch to eager PyTorch (ours[0]) and to
    Optimum's best, the faster of its rows in each round."""
    out = []
    for label in ours + theirs:
        row = {"row": label, "tokens_per_s": {}, "x_eager": {}, "x_optimum_best": {}, "passes": passes[label]}
        for b in map(str, batches):
            mine, eager = passes[label][b], passes[ours[0]][b]
            best = [max(passes[t][b][i] for t in theirs) for i in range(len(mine))]
            row["tokens_per_s"][b] = statistics.median(mine)
            row["x_eager"][b] = statistics.median(m / e for m, e in zip(mine, eager))
            row["x_optimum_best"][b] = statistics.median(m / o for m, o in zip(mine, best))
        out.append(row)
    return out


def markdown(result: dict) -> str:
    st, env, opt = result["settings"], result["environment"], result["optimum"]
    batches = [str(b) for b in st["batches"]]
    lines = [f"# This project's CPU backends against Optimum's best: {cpu_line(env['cpu'])}", "",
             f"model: {model_line(result['model'])}; prompt {st['prompt_tokens']} tokens, {st['new_tokens']} new tokens, "
             f"greedy; tokens/s the median of {st['rounds']} alternated rounds, the prefill included; ratios paired by "
             f"round. Optimum: optimum-onnx with transformers {opt['transformers']}, onnxruntime {opt['onnxruntime']}; "
             f"ours: torch {env['packages'].get('torch')}, onnxruntime {env['packages'].get('onnxruntime')}", "",
             "| row | " + " | ".join(f"tokens/s b{b} | x eager b{b} | x Optimum's best b{b}" for b in batches) + " |",
             "|---|" + "---:|---:|---:|" * len(batches)]
    for r in result["rows"]:
        lines.append(f"| {r['row']} | " + " | ".join(
            f"{r['tokens_per_s'][b]:,.1f} | {r['x_eager'][b]:.2f} | {r['x_optimum_best'][b]:.2f}" for b in batches) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipeline.optimum_compare", description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="the run's name under --artifacts")
    parser.add_argument("--artifacts", default="artifacts", type=Path)
    parser.add_argument("--optimum-python", required=True, help="the Python of Optimum's environment (make optimum-env)")
    parser.add_argument("--batch", default="1,8", help="batch sizes, comma-separated")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    run = RunDir(args.artifacts / args.run)
    if not Path(args.optimum_python).is_file():
        parser.error(f"--optimum-python {args.optimum_python}: no such file; make optimum-env makes one")
    result = compare(run, args.optimum_python, [int(b) for b in args.batch.split(",")], args.prompt_tokens,
                     args.new_tokens, args.rounds)
    sys.stdout.write(markdown(result))


if __name__ == "__main__":
    main()
