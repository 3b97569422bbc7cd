"""`gpt2-deploy validate`: every backend and precision against PyTorch fp32 on the same inputs.

Per row: relative logits error, max abs error, top-1 agreement (all positions, and where the
reference's top-1 is clear), held-out perplexity and its change, and greedy-generation agreement.
Each row is held to its precision's budget (config `validate.budgets`); the stage exits non-zero
when a row exceeds it. Rows that cannot run here are listed as skipped, with the reason."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.artifacts import RunDir, atomic_write_json, sha256_file
from pipeline.config import Config
from pipeline.data import heldout_blocks, prepare_data
from pipeline.engines.metadata import EngineMeta, plans_for
from pipeline.errors import UserError
from pipeline.metrics import budget_failures, compare_logits, greedy_agreement
from pipeline.model import load_checkpoint
from pipeline.progress import progress
from pipeline.runtime.backend import Backend, BackendUnavailable
from pipeline.runtime.generate import Generator, left_pad
from pipeline.runtime.loader import default_matrix, open_backend
from pipeline.runtime.sampling import Sampling
from pipeline.runtime.torch_eager import TorchEagerBackend
from pipeline.tokenizer import load_tokenizer


@dataclass
class Inputs:
    prompts: list[list[int]]  # varied lengths: batches are left-padded
    blocks: torch.Tensor  # [N, T] perplexity blocks
    new_tokens: int


@dataclass
class Row:
    backend: str
    precision: str
    status: str  # pass | fail | skipped
    reason: str = ""
    metrics: dict = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


def measure(backend: Backend, inputs: Inputs) -> dict:
    """Prefill logits of the prompts, held-out perplexity, and greedy tokens, from one backend."""
    device = backend.device
    batch = left_pad(inputs.prompts, 0, device)
    backend.reset(len(inputs.prompts), batch.input_ids.shape[1])
    logits = backend.forward(batch.input_ids, batch.attention_mask, batch.position_ids).cpu()
    blocks = inputs.blocks.to(device)
    n, length = blocks.shape
    backend.reset(n, length)
    block_logits = backend.forward(blocks, torch.ones_like(blocks), torch.arange(length, device=device).expand(n, length))
    loss = F.cross_entropy(block_logits[:, :-1].flatten(0, 1).float(), blocks[:, 1:].flatten())
    tokens = Generator(backend).generate(inputs.prompts, Sampling(max_new_tokens=inputs.new_tokens))
    return {"logits": logits, "mask": batch.attention_mask.cpu(), "perplexity": math.exp(loss.item()), "tokens": tokens}


def check_provenance(run: RunDir, backend: str, precision: str) -> None:
    """A graph must be the one export wrote, from the checkpoint that is there now; an engine must
    have been built from that graph. Missing artifacts are left to the backend to report."""
    manifest = run.manifest()
    path = run.onnx(precision) / "model.onnx"
    if not path.exists():
        return
    entry = manifest["stages"].get(f"export-{precision}")
    redo = "; rerun `gpt2-deploy export --force`"
    if entry is None:
        raise UserError(f"{path}: not recorded in {run.manifest_path} (an export that did not finish?){redo}")
    if entry.get("checkpoint") != run.artifact_hashes("finetune"):
        raise UserError(f"{path}: exported from another checkpoint than {run.checkpoint}{redo}")
    recorded = manifest["artifacts"].get(f"onnx/{precision}/model.onnx", {}).get("sha256")
    if recorded != sha256_file(path):
        raise UserError(f"{path}: does not match the sha256 in {run.manifest_path}{redo}")
    if backend == "trt":
        for plan in plans_for(run.engines, precision):
            if EngineMeta.read(plan.with_suffix(".json")).onnx_sha256 != recorded:
                raise UserError(f"{plan}: built from another {precision} graph than the one exported now; "
                                "rerun `gpt2-deploy build-engine --force`")


def validate(cfg: Config, run: RunDir, device: torch.device, pairs: list[tuple[str, str]] | None = None,
             polygraphy: bool = False) -> dict:
    model = load_checkpoint(run.checkpoint)
    tokenizer = load_tokenizer(run.checkpoint)
    splits = prepare_data(cfg, run, tokenizer)
    v = cfg.validate
    prompt_blocks = heldout_blocks(splits, v.prompts, v.prompt_tokens, "validate.prompts", from_end=True)
    ppl_blocks = heldout_blocks(splits, v.prompts + v.perplexity_blocks, cfg.data.calib_block_size,
                                "validate.perplexity_blocks", from_end=True)[:v.perplexity_blocks]
    # prompts of decreasing length, so every batch exercises left padding
    prompts = [row[: max(1, v.prompt_tokens - 3 * i)].tolist() for i, row in enumerate(prompt_blocks)]
    inputs = Inputs(prompts, torch.from_numpy(np.ascontiguousarray(ppl_blocks)), v.new_tokens)
    reference = measure(TorchEagerBackend(model, "fp32", device), inputs)
    rows = []
    for name, precision in progress(pairs or default_matrix(), total=len(pairs or default_matrix()), description="validate"):
        if name in ("ort", "trt"):
            check_provenance(run, name, precision)
        try:
            backend = open_backend(run, name, precision, device)  # a fresh model: torch backends cast theirs
        except BackendUnavailable as e:
            rows.append(Row(name, precision, "skipped", str(e)))
            continue
        got = measure(backend, inputs)
        metrics = {**compare_logits(got["logits"], reference["logits"], reference["mask"]),
                   **greedy_agreement(got["tokens"], reference["tokens"]),
                   "perplexity": got["perplexity"],
                   "perplexity_change": got["perplexity"] / reference["perplexity"] - 1}
        failures = budget_failures(metrics, v.budgets[precision])
        rows.append(Row(name, precision, "fail" if failures else "pass", metrics=metrics, failures=failures))
        del backend
    result = {"device": str(device), "reference": {"backend": "torch", "precision": "fp32",
                                                    "perplexity": reference["perplexity"]},
              "inputs": {"prompts": len(prompts), "prompt_tokens": v.prompt_tokens, "new_tokens": v.new_tokens,
                         "perplexity_blocks": v.perplexity_blocks, "perplexity_block_tokens": cfg.data.calib_block_size},
              "budgets": {k: b.__dict__ for k, b in v.budgets.items()},
              "rows": [r.__dict__ for r in rows]}
    if polygraphy:
        from pipeline.polygraphy_check import polygraphy_compare
        result["polygraphy"] = polygraphy_compare(run, model, splits, cfg)
    atomic_write_json(run.reports / "validate.json", result)
    return result


def failed(result: dict) -> list[dict]:
    bad = [r for r in result["rows"] if r["status"] == "fail"]
    bad += [p for p in result.get("polygraphy", []) if p["status"] == "fail"]
    return bad


def load_result(run: RunDir) -> dict:
    return json.loads((run.reports / "validate.json").read_text(encoding="utf-8"))
