"""`gpt2-deploy validate`: every backend and precision against PyTorch fp32 on the same inputs.

Per row: relative logits error, max abs error, top-1 agreement (all positions, and where the
reference's top-1 is clear), held-out perplexity and its change, and greedy-generation agreement.
Each row is held to its precision's budget (config `validate.budgets`); the stage exits non-zero
when a row exceeds it. Rows that cannot run here are listed as skipped, with the reason."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from rich.table import Table

from pipeline.accuracy import check, measure
from pipeline.artifacts import RunDir, atomic_write_json
from pipeline.config import Config
from pipeline.data import heldout_blocks, prepare_data
from pipeline.errors import UserError
from pipeline.machine import environment, model_description
from pipeline.model import load_checkpoint
from pipeline.progress import console, progress
from pipeline.runtime.backend import BackendUnavailable
from pipeline.runtime.loader import default_matrix, open_backend
from pipeline.tokenizer import load_tokenizer


@dataclass
class Row:
    backend: str
    precision: str
    status: str  # pass | fail | skipped
    reason: str = ""
    metrics: dict = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


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
    blocks = torch.from_numpy(np.ascontiguousarray(ppl_blocks))
    reference = measure(open_backend(run, "torch", "fp32", device, model), prompts, v.new_tokens, blocks)
    rows = []
    for name, precision in progress(pairs or default_matrix(), total=len(pairs or default_matrix()), description="validate"):
        try:
            backend = open_backend(run, name, precision, device)  # a fresh model: torch backends cast theirs
        except BackendUnavailable as e:
            rows.append(Row(name, precision, "skipped", str(e)))
            continue
        metrics, failures = check(backend, reference, prompts, v.new_tokens, v.budgets[precision], blocks)
        rows.append(Row(name, precision, "fail" if failures else "pass", metrics=metrics, failures=failures))
        del backend
    result = {"device": str(device), "model": model_description(run.checkpoint), "environment": environment(device),
              "reference": {"backend": "torch", "precision": "fp32",
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




def table(result: dict) -> Table:
    blocks = result["inputs"]
    table = Table(title=f"validate vs torch fp32 on {result['device']} (reference perplexity "
                        f"{result['reference']['perplexity']:.2f} on the last {blocks['perplexity_blocks']} held-out "
                        f"blocks of {blocks['perplexity_block_tokens']} tokens; finetune's is on every "
                        f"held-out block of data.block_size)")
    for col in ("backend", "precision", "status", "rel err", "decode err", "max abs", "top-1", "top-1 clear",
                "greedy same", "first diverge", "ppl change"):
        table.add_column(col, justify="left" if col in ("backend", "precision", "status") else "right")
    colour = {"pass": "green", "fail": "red", "skipped": "yellow"}
    for r in result["rows"]:
        m = r["metrics"]
        cells = [f"{m['rel_error']:.2e}", f"{m['decode_rel_error']:.2e}", f"{m['max_abs']:.3g}", f"{m['top1']:.3f}",
                 f"{m['top1_clear']:.3f}", f"{m['identical_tokens']:.3f}", f"{m['mean_first_divergence']:.1f}",
                 f"{100 * m['perplexity_change']:+.2f}%"] if m else [""] * 8
        table.add_row(r["backend"], r["precision"], f"[{colour[r['status']]}]{r['status']}[/]", *cells)
    for p in result.get("polygraphy", []):
        table.add_row("polygraphy", p["precision"], f"[{colour[p['status']]}]{p['status']}[/]", *[""] * 8)
    return table


def report(result: dict, run: RunDir) -> None:
    """The table and each row's reason on the console; a UserError when a row exceeds its budget."""
    console.print(table(result))
    for r in result["rows"] + result.get("polygraphy", []):
        why = "; ".join(r.get("failures", [])) or r.get("reason") or (r.get("detail") if r["status"] != "pass" else "")
        if why:
            console.print(f"  {r.get('backend', 'polygraphy')} {r['precision']} {r['status']}: {why}", highlight=False, markup=False)
    bad = failed(result)
    if bad:
        raise UserError(f"validate: {len(bad)} row(s) exceed their accuracy budget (see the table; "
                        f"{run.reports / 'validate.json'})")
