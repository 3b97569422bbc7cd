"""The bench stage's reports: a markdown table a person reads, a plot a person looks at, and the
comparison with an earlier run that makes a slowdown visible as a regression."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.artifacts import atomic_write_json, atomic_write_text
from pipeline.errors import UserError
from pipeline.machine import model_line
from pipeline.progress import console

REGRESSION = 0.10  # a row 10% slower than before is flagged


def _fmt(value, spec: str) -> str:
    return "" if value is None else format(value, spec)


def markdown(result: dict) -> str:
    env, st = result["environment"], result["settings"]
    where = env.get("gpu", f"CPU ({env.get('cpu_threads')} threads)")
    lines = [f"# Benchmark: {where}", "",
             *([f"model: {model_line(result['model'])}; CPU: {cpu_line(env['cpu'])}", ""] if "model" in result else []),
             f"prompt {st['prompt_tokens']} tokens, {st['new_tokens']} new tokens, {decodings(st)}; median of {st['repeats']} "
             f"interleaved passes, every figure of a row from the same passes (spread: max - min over the median; "
             f"noisy: the row's or its baseline's spread is over 15%, its ratio says little); "
             f"torch {env['packages'].get('torch')}, onnxruntime "
             f"{env['packages'].get('onnxruntime-gpu') or env['packages'].get('onnxruntime')}", "",
             *([floor_line(env["copy_gbps"]), ""] if "copy_gbps" in env else []),
             "| backend | precision | batch | decoding | TTFT ms | decode ms p50 | p90 | p99 | p50 host-synced | tokens/s | spread "
             "| x eager | vs | x greedy | launches/step | read GB/s | of floor | held MiB | load s | warm-up s |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        label = f"| {r['backend']} | {r['precision']} | {r['batch']} | {r.get('decoding', 'greedy')} |"
        if r["status"] != "ok":
            lines.append(f"{label} {r['status']}: {r['reason']} |||||||||||||||||")
            continue
        lines.append(f"{label} {_fmt(r['ttft_ms'], '.2f')} | "
                     f"{_fmt(r['decode_ms_p50'], '.3f')} | {_fmt(r['decode_ms_p90'], '.3f')} | {_fmt(r['decode_ms_p99'], '.3f')} | "
                     f"{_fmt(r.get('decode_ms_p50_synced'), '.3f')} | "
                     f"{_fmt(r['tokens_per_s'], ',.0f')} | {spread(r)} | "
                     f"{_fmt(r['speedup_vs_eager'], '.2f')}{' (noisy)' if r.get('noisy') else ''} | {r['baseline']} | "
                     f"{_fmt(r.get('vs_greedy'), '.2f')} | {_fmt(r.get('launches_per_step'), '.0f')} | "
                     f"{_fmt(r.get('read_gbps'), ',.0f')} | {_fmt(r.get('of_floor'), '.0%')} | "
                     f"{_fmt(r.get('held_memory_mib'), ',.0f')} | {_fmt(r['load_s'], '.1f')} | {_fmt(r['warmup_s'], '.1f')} |")
    return "\n".join(lines) + "\n"


def floor_line(copy_gbps: float) -> str:
    return (f"read GB/s: what a decode step must read (every weight once, each row's KV cache) over its p50 time; "
            f"of floor: that read at the {copy_gbps:,.0f} GB/s a device-to-device copy reached here, over the p50 "
            f"(100%: memory-bound; launches/step: device operations a step launches, GPU only)")


def cpu_line(cpu: dict) -> str:
    """`AMD EPYC 9654 (2 of 2 cores; avx2, avx512f, avx512_vnni; torch kernels AVX512)`: the int8 rows
    depend on the extensions (older reports do not name torch's kernels)."""
    extensions = cpu["vector_extensions"]
    kernels = f"; torch kernels {cpu['torch_kernels']}" if cpu.get("torch_kernels") else ""
    return (f"{cpu['model']} ({cpu['usable_cores']} of {cpu['logical_cores']} cores; "
            f"{', '.join(extensions) if isinstance(extensions, list) else extensions}{kernels})")


def decodings(settings: dict) -> str:
    """How the rows decode: greedy, and the sampled rows' settings where there are some."""
    s = settings.get("sample")
    how = "greedy" if not s else (f"greedy and sampled (temperature {s['temperature']}, top_p {s['top_p']}, "
                                  f"top_k {s['top_k']}, seed {s['seed']})")
    return how + (", every row row-local (--deterministic)" if settings.get("deterministic") else "")


def spread(row: dict) -> str:
    """The row's passes: ±half their range as a share of the median (older reports have none)."""
    return "-" if row.get("spread") is None else f"±{50 * row['spread']:.0f}%"


def plot(result: dict, path: Path) -> None:
    """Per-token latency and throughput against batch size, one line per backend/precision."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[dict]] = {}
    for r in result["rows"]:
        if r["status"] == "ok":
            sampled = " sampled" if r.get("decoding", "greedy") != "greedy" else ""
            series.setdefault(f"{r['backend']} {r['precision']}{sampled}", []).append(r)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, rows in sorted(series.items()):
        rows.sort(key=lambda r: r["batch"])
        batches = [r["batch"] for r in rows]
        left.plot(batches, [r["decode_ms_p50"] for r in rows], marker="o", label=label)
        right.plot(batches, [r["tokens_per_s"] for r in rows], marker="o", label=label)
    for ax, title, unit in ((left, "per-token decode latency (p50)", "ms"), (right, "generated tokens/s", "tokens/s")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    right.legend(fontsize=7, loc="best")
    fig.suptitle(result["environment"].get("gpu", "CPU"))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _is_bench_row(row) -> bool:
    if not (isinstance(row, dict) and all(f in row for f in ("backend", "precision", "batch", "status"))):
        return False
    return row["status"] != "ok" or all(isinstance(row.get(f), (int, float)) for f in ("tokens_per_s", "decode_ms_p50"))


def read_bench(path: Path) -> dict:
    """An earlier bench.json for --compare, checked before the new run starts (not after it)."""
    try:
        old = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"--compare {path}: not a readable bench.json ({type(e).__name__})") from None
    rows = old.get("rows") if isinstance(old, dict) else None
    if not isinstance(rows, list) or not all(_is_bench_row(r) for r in rows):
        raise UserError(f"--compare {path}: not a bench.json (it needs rows with backend, precision, batch, status, "
                        "and tokens/s and p50 where ok); give one that gpt2-deploy bench wrote")
    return old


def compare(new: dict, old: dict) -> list[dict]:
    """Row-by-row change in tokens/s and p50 latency; `regression` where throughput fell by more than 10%."""
    key = lambda r: (r["backend"], r["precision"], r["batch"], r.get("decoding", "greedy"))  # noqa: E731
    before = {key(r): r for r in old["rows"] if r["status"] == "ok"}
    changes = []
    for r in new["rows"]:
        o = before.get(key(r))
        if r["status"] != "ok" or o is None:
            continue
        throughput = r["tokens_per_s"] / o["tokens_per_s"] - 1
        changes.append({"backend": r["backend"], "precision": r["precision"], "batch": r["batch"], "decoding": key(r)[3],
                        "tokens_per_s_change": throughput, "p50_change": r["decode_ms_p50"] / o["decode_ms_p50"] - 1,
                        "regression": throughput < -REGRESSION})
    return changes


def write_reports(result: dict, run) -> None:
    """bench.json, bench.md and bench.png into the run's reports, and the table on the console."""
    atomic_write_json(run.reports / "bench.json", result)
    atomic_write_text(run.reports / "bench.md", markdown(result))
    plot(result, run.reports / "bench.png")
    console.print(markdown(result), highlight=False, markup=False)
    console.print(f"bench: {run.reports / 'bench.json'}, bench.md, bench.png")


def print_comparison(new: dict, old: dict) -> None:
    for c in compare(new, old):
        flag = "  [red]REGRESSION[/]" if c["regression"] else ""
        sampled = "" if c["decoding"] == "greedy" else f" {c['decoding']}"
        console.print(f"  {c['backend']} {c['precision']} b{c['batch']}{sampled}: tokens/s {100 * c['tokens_per_s_change']:+.1f}%, "
                      f"p50 {100 * c['p50_change']:+.1f}%{flag}")
