"""The load generator against a real server on loopback: a sweep of streaming clients, measured at
the client, reported as json, markdown and png."""

import json

import pytest

from pipeline.errors import UserError
from serve.load_report import write_reports
from serve.loadtest import LoadSettings, loadtest

pytest.importorskip("fastapi", reason="the [serve] extra is not installed")


@pytest.fixture(scope="module")
def server(exported_run, tmp_path_factory):
    from tests.serve.conftest import start_server, stop_server

    _, run, _ = exported_run
    proc, url = start_server(run, tmp_path_factory.mktemp("loadtest") / "server.log")
    yield url
    stop_server(proc)


def test_a_sweep_measures_every_level_at_the_client(server, tmp_path):
    settings = LoadSettings(server, concurrency=[1, 3], prompt_tokens=16, max_tokens=6, duration_s=2.0, warmup_s=0.5)
    result = loadtest(settings)
    assert [r["concurrency"] for r in result["rows"]] == [1, 3]
    for row in result["rows"]:
        assert row["errors"] == {} and row["requests"] >= 1 and row["tokens_per_s"] > 0
        assert row["tokens_per_request"] == 6  # EOS ignored: every request its full length
        # chunks that arrive in one read share their time: on a CPU a micro model's may all be one read
        assert 0 < row["ttft_ms"]["p50"] <= row["e2e_ms"]["p50"] and row["itl_ms"]["p50"] >= 0 and row["tpot_ms"]["p50"] > 0
    assert result["server"]["backend"] == "ort" and result["server"]["shape"]["hidden"] == 32
    assert result["client"]["cpu"]["usable_cores"] >= 1
    write_reports(result, tmp_path)
    assert json.loads((tmp_path / "loadtest.json").read_text())["rows"] == result["rows"]
    assert (tmp_path / "loadtest.md").read_text().count("clients |") == 2
    assert "model: custom, " in (tmp_path / "loadtest.md").read_text()
    assert (tmp_path / "loadtest.png").read_bytes().startswith(b"\x89PNG")


def test_clients_spread_over_processes_are_counted_together(server):
    result = loadtest(LoadSettings(server, concurrency=[4], prompt_tokens=8, max_tokens=4, duration_s=2.0, warmup_s=1.0,
                                   workers=2))
    row = result["rows"][0]
    assert row["client_processes"] == 2 and row["errors"] == {} and row["requests"] >= 4
    assert row["tokens_per_request"] == 4 and row["tokens_per_s"] > 0


def test_a_poisson_rate_and_a_missing_server(server, tmp_path):
    result = loadtest(LoadSettings(server, rate=5.0, prompt_tokens=8, max_tokens=3, duration_s=1.5, warmup_s=0.0))
    assert result["rows"][0]["rate"] == 5.0 and result["rows"][0]["requests"] >= 1
    with pytest.raises(UserError, match="no OpenAI-compatible server answers there"):
        loadtest(LoadSettings("http://127.0.0.1:9", duration_s=1.0))


def test_latencies_are_of_the_requests_sent_in_the_measured_window():
    """The warm-up's requests (all clients start at once) and those sent after the window count toward
    neither the latencies nor the requests; tokens/s counts the tokens that arrived inside it."""
    from serve.loadtest import Run, Sample, summarise

    run = Run(arrivals=[0.5, 1.5, 2.5, 3.5],
              samples=[Sample(0.2, 0.9, [0.1], 1.0, 2), Sample(1.2, 0.01, [0.02], 0.05, 2), Sample(3.2, 0.9, [0.1], 1.0, 2)])
    row = summarise(run, {"concurrency": 1}, (1.0, 3.0))
    assert row["requests"] == 1 and row["ttft_ms"]["p50"] == pytest.approx(10.0) and row["tokens_per_s"] == 1.0


def test_a_mixed_load_sends_the_share_of_sampled_requests_it_asks_for(server):
    """Half the requests sampled (temperature, top_p, top_k as given), half greedy; the server answers both."""
    import random

    from serve.load_report import describe_sampling
    from serve.loadtest import sampling_fields

    settings = LoadSettings(server, concurrency=[2], prompt_tokens=8, max_tokens=4, duration_s=1.5, warmup_s=0.0,
                            temperature=0.8, top_p=0.95, top_k=40, sampled_share=0.5)
    rng = random.Random(0)
    fields = [sampling_fields(settings, rng) for _ in range(2000)]
    sampled = [f for f in fields if f["temperature"] > 0]
    assert 900 < len(sampled) < 1100 and all(f == {"temperature": 0.8, "top_p": 0.95, "top_k": 40} for f in sampled)
    assert describe_sampling({"temperature": 0.8, "top_p": 0.95, "top_k": 40, "sampled_share": 0.5}) == \
        "50% sampled (temperature 0.8, top_p 0.95, top_k 40), the rest greedy"
    row = loadtest(settings)["rows"][0]
    assert row["errors"] == {} and row["requests"] >= 2 and row["tokens_per_request"] == 4


def test_a_lengths_file_gives_each_request_its_prompt_and_output_length(server, tmp_path):
    import random

    from pipeline.tokenizer import embedded_gpt2_tokenizer
    from serve.loadtest import workload

    lengths = tmp_path / "lengths.txt"
    lengths.write_text("# prompt output\n12 3\n\n40, 5  # a longer one\n", encoding="utf-8")
    settings = LoadSettings(server, concurrency=[2], duration_s=1.5, warmup_s=0.0, lengths_file=str(lengths))
    requests = workload(settings, random.Random(0))
    tokenizer = embedded_gpt2_tokenizer()
    assert [o for _, o in requests] == [3, 5]
    assert [len(tokenizer(t)["input_ids"]) for t, _ in requests] == pytest.approx([12, 40], abs=3)
    result = loadtest(settings)
    row = result["rows"][0]
    assert row["errors"] == {} and row["requests"] >= 2 and 3 <= row["tokens_per_request"] <= 5
    write_reports(result, tmp_path / "out")
    assert f"lengths from {lengths}" in (tmp_path / "out" / "loadtest.md").read_text()


@pytest.mark.parametrize("text, says", [("12 3\n7\n", r":2: '7' is not two whole numbers"),
                                        ("12 0\n", r":1: '12 0'"), ("# nothing\n", "no 'prompt_tokens output_tokens' line")])
def test_a_lengths_file_it_cannot_read_is_named_with_its_line(tmp_path, text, says):
    from serve.loadtest import read_lengths

    path = tmp_path / "lengths.txt"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UserError, match=says):
        read_lengths(str(path))
    with pytest.raises(UserError, match="cannot read it"):
        read_lengths(str(tmp_path / "missing.txt"))
