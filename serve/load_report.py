"""The load test's report: latency percentiles, and the json, markdown table and plot that
`gpt2-deploy loadtest` writes (serve.loadtest measures)."""

from __future__ import annotations

import io

import numpy as np

from pipeline.progress import console


def percentiles(values: list[float], scale: float = 1e3) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None, "p99": None}
    return {f"p{q}": float(np.percentile(values, q)) * scale for q in (50, 90, 99)}


def describe_sampling(st: dict) -> str:
    if st.get("temperature", 0) <= 0:
        return "greedy"
    share = st.get("sampled_share", 1.0)
    sampled = f"temperature {st['temperature']:g}, top_p {st['top_p']:g}, top_k {st['top_k']}"
    return sampled if share >= 1 else f"{100 * share:.0f}% sampled ({sampled}), the rest greedy"


def fmt(value, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def markdown(result: dict) -> str:
    from pipeline.machine import model_line

    st, server = result["settings"], result["server"]
    lines = [f"# Load test: {server['model']}, {server.get('backend', '?')} {server.get('precision', '?')} "
             f"on {server.get('device', '?')}", "",
             *([f"model: {model_line(server['shape'])}", ""] if "shape" in server else []),
             f"{st['url']}; " + (f"lengths from {st['lengths_file']}" if st.get("lengths_file") else
                                 f"prompt ~{st['prompt_tokens']} tokens, {st['max_tokens']} new tokens, spread {st['spread']}")
             + f"{' (EOS ignored)' if st['ignore_eos'] else ''}, {describe_sampling(st)}; "
             f"{st['duration_s']:g} s per level "
             f"after {st['warmup_s']:g} s of warm-up; streaming clients; latencies of the requests sent in those "
             f"{st['duration_s']:g} s", "",
             "| load | requests | errors | tokens/s | TTFT ms p50 / p90 / p99 | ITL ms p50 / p90 / p99 | TPOT ms p50 / p90 / p99 "
             "| end to end ms p50 / p90 / p99 |",
             "|---|---:|---:|---:|---|---|---|---|"]
    for r in result["rows"]:
        load = f"{r['concurrency']} clients" if "concurrency" in r else f"{r['rate']:g} req/s"
        if r.get("client_processes", 1) > 1:
            load += f" ({r['client_processes']} processes)"
        trio = lambda d, spec=".1f": " / ".join(fmt(d[k], spec) for k in ("p50", "p90", "p99"))  # noqa: E731
        lines.append(f"| {load} | {r['requests']} | {sum(r['errors'].values())} | {r['tokens_per_s']:,.0f} | "
                     f"{trio(r['ttft_ms'])} | {trio(r['itl_ms'], '.3f')} | {trio(r['tpot_ms'], '.3f')} | "
                     f"{trio(r['e2e_ms'], '.0f')} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    x = [r.get("concurrency", r.get("rate")) for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(x, [r["tokens_per_s"] for r in rows], marker="o")
    left.set(xlabel="clients" if "concurrency" in rows[0] else "requests/s", ylabel="generated tokens/s", xscale="log")
    for key, label in (("ttft_ms", "TTFT p50"), ("itl_ms", "ITL p50"), ("tpot_ms", "TPOT p50")):
        right.plot(x, [r[key]["p50"] for r in rows], marker="o", label=label)
    right.set(xlabel=left.get_xlabel(), ylabel="ms", xscale="log", yscale="log")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")
    plt.close(fig)


def write_reports(result: dict, folder) -> None:
    from pipeline.artifacts import (
        atomic_write_bytes,
        atomic_write_json,
        atomic_write_text,
    )

    atomic_write_json(folder / "loadtest.json", result)
    atomic_write_text(folder / "loadtest.md", markdown(result))
    buffer = io.BytesIO()
    plot(result, buffer)
    atomic_write_bytes(folder / "loadtest.png", buffer.getvalue())
    console.print(markdown(result), highlight=False, markup=False)
