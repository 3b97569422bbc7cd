"""`gpt2-deploy export`: checkpoint -> onnx/{fp32,fp16,int8,int8-wo}/model.onnx.

fp32 comes from PyTorch; the other precisions are transforms of the fp32 graph. Each variant is
written into a temporary folder, checked (ONNX checker, shape inference, the contract, and a
parity run on ONNX Runtime against PyTorch) and only then moved into place, so a failed or
interrupted export leaves nothing a later stage could mistake for a good graph."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from pipeline.artifacts import RunDir, atomic_dir, atomic_write_json, fingerprint
from pipeline.config import Config
from pipeline.data import heldout_blocks, prepare_data
from pipeline.errors import UserError
from pipeline.export.contract import Contract, check_graph
from pipeline.export.fp16 import convert_fp16
from pipeline.export.int8 import convert_int8_qdq, convert_int8_weight_only
from pipeline.export.onnx_fp32 import WithKVCache, export_fp32, finish_graph
from pipeline.metrics import agreement, budget_failures, measure
from pipeline.model import load_checkpoint
from pipeline.progress import console, progress
from pipeline.runtime.ort_backend import OrtBackend
from pipeline.runtime.torch_eager import TorchEagerBackend
from pipeline.tokenizer import load_tokenizer

MODEL_FILE = "model.onnx"
CALIBRATED = ("fp16", "int8")  # precisions whose conversion runs the graph on calibration data
AUTOCAST_SAMPLES = 8


def calibration_feeds(model, blocks: np.ndarray) -> dict[str, np.ndarray]:
    """Contract inputs for calibration: the first half of each held-out block becomes a real KV
    cache (computed by PyTorch), the second half the new tokens, so decode-time activation
    ranges (attention over a filled cache) are what gets calibrated."""
    contract = Contract.from_hf_config(model.config)
    batch, length = blocks.shape
    past = length // 2
    device = next(model.parameters()).device  # wherever the model is: validate may have moved it to a GPU
    empty = torch.zeros(batch, contract.n_head, 0, contract.head_dim, device=device)
    with torch.no_grad():
        out = WithKVCache(model)(torch.from_numpy(blocks[:, :past]).to(device),
                                 torch.ones(batch, past, dtype=torch.long, device=device),
                                 torch.arange(past, device=device).expand(batch, past), *[empty] * (2 * contract.n_layer))
    feeds = {"input_ids": blocks[:, past:], "attention_mask": np.ones((batch, length), np.int64),
             "position_ids": np.broadcast_to(np.arange(past, length), (batch, length - past)).copy()}
    feeds.update({name: t.float().cpu().numpy() for name, t in zip(contract.kv_names("past_key_values"), out[1:])})
    return feeds


def parity_check(onnx_path: Path, precision: str, model, prompts: list[list[int]], new_tokens: int) -> dict:
    """Prefill and decode-step logits and greedy tokens of the graph on ONNX Runtime CPU vs PyTorch fp32."""
    reference = measure(TorchEagerBackend(model, "fp32"), prompts, new_tokens)
    candidate = measure(OrtBackend(onnx_path, precision, "cpu", model.config.n_positions), prompts, new_tokens)
    return agreement(candidate, reference)


def _convert(precision: str, fp32_path: Path, out: Path, model, calib: np.ndarray, opset: int) -> None:
    if precision == "fp32":
        export_fp32(model, out, opset)
    elif precision == "fp16":
        npz = out.with_name("calibration.npz")
        # AutoCast keeps every intermediate tensor of its reference run in memory: a few samples
        # show the value ranges it needs, 64 of the 124M model do not fit in 24 GB
        np.savez(npz, **calibration_feeds(model, calib[:AUTOCAST_SAMPLES]))
        convert_fp16(fp32_path, out, npz)
        npz.unlink()
    elif precision == "int8":
        convert_int8_qdq(fp32_path, out, calibration_feeds(model, calib))
    else:
        convert_int8_weight_only(fp32_path, out)


def export(cfg: Config, run: RunDir, precisions: list[str] | None = None, force: bool = False) -> dict:
    run.ensure_writable()
    precisions = precisions or cfg.export.precisions
    model = load_checkpoint(run.checkpoint)
    tokenizer = load_tokenizer(run.checkpoint)
    contract = Contract.from_hf_config(model.config)
    ckpt_hashes = run.artifact_hashes("finetune")
    if not ckpt_hashes:
        raise UserError(f"{run.checkpoint}: not recorded in {run.manifest_path}; rerun `gpt2-deploy finetune`")
    splits = prepare_data(cfg, run, tokenizer)
    d, e = cfg.data, cfg.export
    blocks = heldout_blocks(splits, d.calib_samples + e.parity_prompts, d.calib_block_size, "data.calib_samples")
    calib = blocks[:d.calib_samples]
    # prompts of different lengths, so the parity check covers left padding
    prompts = [row[: max(1, d.calib_block_size // 2 - 3 * i)].tolist() for i, row in enumerate(blocks[d.calib_samples:])]
    order = ["fp32"] + [p for p in precisions if p != "fp32"]  # every other variant derives from fp32
    report = _load_report(run)
    for precision in progress(order, total=len(order), description="export"):
        stage = f"export-{precision}"
        fp32_hash = run.artifact_hashes("export-fp32").get(f"onnx/fp32/{MODEL_FILE}")
        stage_fp = fingerprint(ckpt_hashes, e.opset, fp32_hash if precision != "fp32" else None,
                               (d.calib_samples, d.calib_block_size, run.artifact_hashes("data")) if precision in CALIBRATED else None)
        if not force and run.is_fresh(stage, stage_fp):
            console.print(f"export: onnx/{precision} is up to date")
            continue
        run.forget(stage)
        started = time.perf_counter()
        with atomic_dir(run.onnx(precision)) as tmp:
            out = tmp / MODEL_FILE
            _convert(precision, run.onnx("fp32") / MODEL_FILE, out, model, calib, e.opset)
            graph = finish_graph(out)
            check_graph(graph, contract, f"onnx/{precision}")
            seconds = time.perf_counter() - started
            parity = parity_check(out, precision, model, prompts, e.parity_tokens)
            failures = budget_failures(parity, cfg.validate.budgets[precision])
            if failures:
                raise UserError(f"export {precision}: the graph disagrees with PyTorch on ONNX Runtime "
                                f"({'; '.join(failures)}); nothing was written")
        files = sorted(p for p in run.onnx(precision).iterdir())
        report[precision] = {"export_seconds": round(seconds, 2), "bytes": sum(f.stat().st_size for f in files),
                             "files": [f.name for f in files], "opset": e.opset,
                             "ir_version": graph.ir_version, "parity_ort_cpu": parity}
        run.record(stage, [run.onnx(precision)], stage_fp, {"export": cfg.section("export"), "data": cfg.section("data")},
                   {"checkpoint": ckpt_hashes})
        console.print(f"export: onnx/{precision} {report[precision]['bytes'] / 1e6:.1f} MB in {seconds:.1f}s; "
                      f"vs PyTorch: rel error {parity['rel_error']:.2e}, top-1 {parity['top1']:.3f}, "
                      f"greedy identical {parity['identical_tokens']:.3f}")
    atomic_write_json(run.reports / "export.json", report)
    return report


def _load_report(run: RunDir) -> dict:
    path = run.reports / "export.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
