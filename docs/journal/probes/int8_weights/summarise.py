"""The figures of int8_sitting.sh's reports in a few lines: per preset, the triton rows' ms a step and
tokens/s at each batch, int8-wo over fp16, launches a step and the share of the memory floor where the
bench recorded them, and validate's relative error, top-1 and greedy agreement.
    python docs/journal/probes/int8_weights/summarise.py OUT_FOLDER"""

import json
import sys
from pathlib import Path


def floor(fp16: dict, int8: dict) -> str:
    """Launches a step and the share of the memory floor reached, fp16 / int8-wo (benches before those columns: none)."""
    if fp16.get("of_floor") is None:
        return ""
    return (f" | launches {fp16['launches_per_step'] or 0:.0f} / {int8['launches_per_step'] or 0:.0f}"
            f" | of floor {fp16['of_floor']:.0%} / {int8['of_floor']:.0%} (read {fp16['step_read_mb']:,.0f} / {int8['step_read_mb']:,.0f} MB)")


def held(row: dict) -> float:
    """The memory the row's backend holds (benches before that column: the device's memory in use then)."""
    return row.get("held_memory_mib", row.get("peak_memory_mib")) or 0


def main() -> None:
    out = Path(sys.argv[1])
    for bench in sorted(out.glob("bench_*.json")):
        preset = bench.stem[len("bench_"):]
        rows = {(r["backend"], r["precision"], r["batch"]): r for r in json.loads(bench.read_text())["rows"]
                if r.get("status") == "ok" and r["backend"] == "triton"}
        for batch in sorted({b for _, _, b in rows}):
            fp16, int8 = rows.get(("triton", "fp16", batch)), rows.get(("triton", "int8-wo", batch))
            if fp16 and int8:
                print(f"{preset} b{batch}: fp16 {fp16['decode_ms_p50']:.3f} ms {fp16['tokens_per_s']:,.0f} tok/s | "
                      f"int8-wo {int8['decode_ms_p50']:.3f} ms {int8['tokens_per_s']:,.0f} tok/s | "
                      f"step ratio {int8['decode_ms_p50'] / fp16['decode_ms_p50']:.2f} | "
                      f"held MiB {held(fp16):,.0f} / {held(int8):,.0f}"
                      f"{floor(fp16, int8)}")
        validate = out / f"validate_{preset}.json"
        if validate.exists():
            for r in json.loads(validate.read_text())["rows"]:
                m = r.get("metrics") or {}
                print(f"{preset} validate {r['backend']} {r['precision']}: {r['status']} rel {m.get('rel_error', float('nan')):.2e} "
                      f"decode {m.get('decode_rel_error', float('nan')):.2e} top1 {m.get('top1', float('nan')):.3f} "
                      f"greedy {m.get('identical_tokens', float('nan')):.3f} ppl {m.get('perplexity_change', float('nan')):+.4f}")


if __name__ == "__main__":
    main()
