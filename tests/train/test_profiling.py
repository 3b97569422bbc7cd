"""`profile`: a trace Chrome and Perfetto read, and the top-ops table, from real training steps."""

import json

from pipeline.artifacts import RunDir
from pipeline.train.profiling import profile_training


def test_a_trace_and_a_top_ops_table_of_the_recorded_steps(micro_config, tmp_path):
    folder = profile_training(micro_config(), RunDir(tmp_path / "run"), steps=2, rows=5)
    trace = json.loads((folder / "trace.json").read_text())
    assert any(e.get("name", "").startswith("ProfilerStep#") for e in trace["traceEvents"])
    table = (folder / "top_ops.txt").read_text()
    assert "Self CPU" in table and "aten::" in table
