"""Accuracy of a candidate backend against a reference on the same inputs: the comparison code that
export's parity check and the validate stage share (measure, agreement, budget_failures)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from pipeline.precisions import Budget
from pipeline.runtime.backend import Backend
from pipeline.runtime.batch import left_pad
from pipeline.runtime.dynamic.torch_eager import TorchEagerBackend
from pipeline.runtime.generate import Generator
from pipeline.runtime.loader import open_graph
from pipeline.runtime.sampling import Sampling

CLEAR_MARGIN = 0.5  # logits; a reference top-1 that leads its runner-up by this much is "clear"
PROBE_TOKEN = 13  # "." fed to every row for one decode step after the prefill, the same for every backend


def compare_logits(test: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor | None = None) -> dict[str, float]:
    """test/ref [..., V] fp32; mask [...] selects the positions that count (e.g. not padding).

    rel_error    ||test - ref|| / ||ref|| over all counted logits
    max_abs      the largest absolute difference
    top1         share of positions where the argmax agrees
    top1_clear   the same, only where the reference's top-1 leads its runner-up by CLEAR_MARGIN
                 (near-ties flip under any rounding and say little about the engine)"""
    test, ref = test.float(), ref.float()
    if mask is not None:
        test, ref = test[mask.bool()], ref[mask.bool()]
    test, ref = test.reshape(-1, ref.shape[-1]), ref.reshape(-1, ref.shape[-1])
    diff = test - ref
    top2 = ref.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > CLEAR_MARGIN
    agree = test.argmax(-1) == ref.argmax(-1)
    return {"rel_error": float(diff.norm() / ref.norm()), "max_abs": float(diff.abs().max()),
            "top1": float(agree.float().mean()),
            "top1_clear": float(agree[clear].float().mean()) if clear.any() else 1.0,
            "positions": int(ref.shape[0]), "clear_positions": int(clear.sum())}


def greedy_agreement(test: list[list[int]], ref: list[list[int]]) -> dict[str, float]:
    """Share of identical tokens (position by position) and the mean first-divergence position
    (the sequence length where none diverges)."""
    same = total = 0
    firsts = []
    for t, r in zip(test, ref):
        n = max(len(t), len(r))
        matches = [i < len(t) and i < len(r) and t[i] == r[i] for i in range(n)]
        same, total = same + sum(matches), total + n
        firsts.append(next((i for i, ok in enumerate(matches) if not ok), n))
    return {"identical_tokens": same / total if total else 1.0, "mean_first_divergence": sum(firsts) / len(firsts),
            "sequences_identical": sum(t == r for t, r in zip(test, ref)) / len(ref)}


def measure(backend: Backend, prompts: list[list[int]], new_tokens: int, blocks: torch.Tensor | None = None) -> dict:
    """What one backend computes on the shared inputs: prefill logits of the left-padded prompts and
    of one decode step after them (the path generation runs; backends often compute it differently),
    their greedy continuations, and (given held-out `blocks` [N, T]) perplexity. Logits are copied
    out at once: a backend may hand back a buffer its next call rewrites."""
    device = backend.device
    batch = left_pad(prompts, 0, device)
    rows, width = batch.host_ids.shape
    backend.reset(rows, width + 1)
    logits = backend.prefill(batch, last_only=False).to("cpu", copy=True)
    probe = torch.full((rows, 1), PROBE_TOKEN, dtype=torch.long, device=device)
    step_logits = backend.decode(probe, batch.position_ids[:, -1:] + 1)[:, None].to("cpu", copy=True)
    found = {"logits": logits, "step_logits": step_logits, "mask": batch.attention_mask.cpu(),
             "tokens": Generator(backend).generate(prompts, Sampling(max_new_tokens=new_tokens))}
    if blocks is not None:
        n, length = blocks.shape
        backend.reset(n, length)
        blocks = blocks.to(device)
        block_logits = backend.prefill(left_pad(blocks.cpu().numpy(), 0, device), last_only=False)
        found["perplexity"] = math.exp(F.cross_entropy(block_logits[:, :-1].flatten(0, 1).float(), blocks[:, 1:].flatten()).item())
    return found


def agreement(got: dict, ref: dict) -> dict:
    """Every comparison of two `measure` results that both of them allow."""
    metrics = {**compare_logits(got["logits"], ref["logits"], ref["mask"]),
               "decode_rel_error": compare_logits(got["step_logits"], ref["step_logits"])["rel_error"],
               **greedy_agreement(got["tokens"], ref["tokens"])}
    if "perplexity" in got and "perplexity" in ref:
        metrics.update(perplexity=got["perplexity"], perplexity_change=got["perplexity"] / ref["perplexity"] - 1)
    return metrics


def budget_failures(metrics: dict, budget: Budget) -> list[str]:
    """Every way the metrics exceed the budget (perplexity only where it was measured)."""
    failures = []
    if metrics["rel_error"] > budget.max_rel_error:
        failures.append(f"relative logits error {metrics['rel_error']:.2e} > {budget.max_rel_error:.2e}")
    if metrics["decode_rel_error"] > budget.max_rel_error:
        failures.append(f"relative logits error of a decode step {metrics['decode_rel_error']:.2e} > {budget.max_rel_error:.2e}")
    if metrics["top1_clear"] < budget.min_top1_clear:
        failures.append(f"clear top-1 agreement {metrics['top1_clear']:.3f} < {budget.min_top1_clear}")
    if metrics["identical_tokens"] < budget.min_greedy_identical:
        failures.append(f"identical greedy tokens {metrics['identical_tokens']:.3f} < {budget.min_greedy_identical}")
    if "perplexity_change" in metrics and abs(metrics["perplexity_change"]) > budget.max_perplexity_change:
        failures.append(f"perplexity change {100 * metrics['perplexity_change']:+.2f}% beyond "
                        f"±{100 * budget.max_perplexity_change:.2f}%")
    return failures


def check(candidate: Backend, reference: dict, prompts: list[list[int]], new_tokens: int, budget: Budget,
          blocks: torch.Tensor | None = None) -> tuple[dict, list[str]]:
    """The candidate measured on the reference's inputs: its metrics and every way they exceed the budget."""
    metrics = agreement(measure(candidate, prompts, new_tokens, blocks), reference)
    return metrics, budget_failures(metrics, budget)


def torch_reference(model, prompts: list[list[int]], new_tokens: int) -> dict:
    """What PyTorch fp32 computes on export's parity prompts: the reference every graph is checked against."""
    return measure(TorchEagerBackend(model, "fp32"), prompts, new_tokens)


def graph_parity(onnx_path, precision: str, config, reference: dict, prompts: list[list[int]], new_tokens: int,
                 budget: Budget, target: str) -> tuple[dict, list[str]]:
    """export's check of a graph before it lands: ONNX Runtime on the CPU against torch_reference."""
    candidate = open_graph(onnx_path, config, precision, torch.device("cpu"), target)
    return check(candidate, reference, prompts, new_tokens, budget)
