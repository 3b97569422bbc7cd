"""Weight bytes in flight at 64 rows (#51, #50): a 64-row product's programs each walk K with
`stages` tiles of BLOCK_K requested ahead, so the weight bytes in flight are about N x stages x
BLOCK_K x the weight's bytes, whatever BLOCK_N; one-byte weights under fp16's tiles have half of
fp16's in flight. This sweep gives both dtypes deeper (up to 256-wide) K tiles and more stages, the
weights on either side of the product, then takes the best of each product into the whole step.
python3 docs/journal/probes/int8_h200/deep_tiles.py [sweep | step CHOSEN.json] [preset ...]
(weights_left.py's run and step, with this grid of tiles.)"""

import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import weights_left  # noqa: E402

ROWS = 64


def deep_tiles(k: int, residual: bool):
    from pipeline.runtime.kernels.tiles import LinearConfig, _k_split
    for bn, bk, stages, left in itertools.product((32, 64), (128, 256), (4, 6), (False, True)):
        if left and bn < 64:  # the left operand's rows are wgmma's 64
            continue
        splits = sorted({1, _k_split(k, bk)[1]}) if residual else [1]
        for split in splits:
            if k % (split * bk) == 0 or split == 1:
                yield LinearConfig(64, bn, bk, split, 4, stages, weights_left=left)


def jobs():
    from pipeline.runtime.kernels.tiles import linear_config
    for c, name, dtype in itertools.product(weights_left.WIDTHS, weights_left.PRODUCTS, ("int8", "fp16")):
        if name == "head":
            continue
        n, k, residual = weights_left.shape(c, name)
        yield c, ROWS, name, dtype, linear_config(ROWS, n, k, residual, dtype == "int8")
        for cfg in deep_tiles(k, residual):
            yield c, ROWS, name, dtype, cfg


if __name__ == "__main__":
    weights_left.jobs = jobs
    if sys.argv[1] == "sweep":
        weights_left.sweep(sys.argv[2] if len(sys.argv) > 2 else os.environ.get("OUT", "."))
    else:
        weights_left.step(sys.argv[2], sys.argv[3:] or ["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"])
