"""GET /metrics on a real server: a burst over the queue cap is refused exactly by its excess with
429, and the counts, gauges and histograms read back through prometheus-client's own parser."""

import threading
import time

import pytest

from tests.serve.conftest import LONG, start_server, stop_server

httpx = pytest.importorskip("httpx", reason="the [serve] extra is not installed")
parser = pytest.importorskip("prometheus_client.parser", reason="the [serve] extra is not installed")

QUEUE = 3


@pytest.fixture(scope="module", params=[1, 2], ids=["one-http-process", "two-http-processes"])
def queued_server(exported_run, tmp_path_factory, request):
    """The cap holds across HTTP processes (they share one count) and their metrics are summed."""
    _, run, _ = exported_run
    proc, url = start_server(run, tmp_path_factory.mktemp("serve") / "queued.log", "--queue", str(QUEUE),
                             "--http-processes", str(request.param))
    yield url
    stop_server(proc)


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics: (name, labels) -> value."""
    reply = httpx.get(f"{url}/metrics", timeout=10)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in parser.text_string_to_metric_families(reply.text) for s in family.samples}


def test_a_burst_over_the_queue_cap_gets_exactly_the_excess_429_and_metrics_count_it(queued_server):
    url, burst = queued_server, QUEUE + 4
    before = scrape(url)
    replies = []
    with httpx.Client(timeout=60) as client, client.stream("POST", f"{url}/generate", json={**LONG, "stream": True}) as long:
        lines = long.iter_lines()  # held: a dropped line iterator would close the stream
        next(line for line in lines if line.startswith("data: {"))  # running: the queue is empty
        assert scrape(url)[("gpt2deploy_requests_running", ())] == 1
        threads = [threading.Thread(target=lambda: replies.append(
            httpx.post(f"{url}/generate", json={"prompt": "hi", "max_new_tokens": 2}, timeout=60).status_code))
            for _ in range(burst)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        while replies.count(429) < burst - QUEUE and time.monotonic() < deadline:
            time.sleep(0.05)
        assert scrape(url)[("gpt2deploy_requests_waiting", ())] == QUEUE
    for t in threads:  # the long stream closed: the waiting ones run
        t.join()
    assert sorted(replies) == [200] * QUEUE + [429] * (burst - QUEUE)

    after = scrape(url)
    grew = lambda name, labels=(): after[(name, labels)] - before.get((name, labels), 0)  # noqa: E731
    assert grew("gpt2deploy_requests_rejected_total", (("reason", "queue_full"),)) == burst - QUEUE
    assert grew("gpt2deploy_requests_total", (("outcome", "rejected"),)) == burst - QUEUE
    assert grew("gpt2deploy_requests_total", (("outcome", "ok"),)) == QUEUE
    assert grew("gpt2deploy_requests_total", (("outcome", "cancelled"),)) == 1
    assert grew("gpt2deploy_time_to_first_token_seconds_count") == QUEUE + 1
    assert grew("gpt2deploy_request_duration_seconds_count") == QUEUE
    assert grew("gpt2deploy_generation_tokens_total") >= QUEUE and grew("gpt2deploy_prompt_tokens_total") >= QUEUE
    assert after[("gpt2deploy_requests_waiting", ())] == 0 and after[("gpt2deploy_requests_running", ())] == 0
    assert not any(name.startswith("gpt2deploy_gpu_") for name, _ in after)  # a CPU server: no NVML metrics


def test_a_scrape_leaves_out_a_file_that_a_starting_process_has_only_created(tmp_path):
    """Several HTTP processes share their figures through files; one that is starting creates each file
    empty before it writes its header, and a scrape that read it then failed (a 500)."""
    from prometheus_client.mmap_dict import MmapedDict, mmap_key

    from serve.metrics import SharedFiles

    written = MmapedDict(str(tmp_path / "counter_1.db"))
    written.write_value(mmap_key("gpt2deploy_requests", "gpt2deploy_requests_total", ["outcome"], ["ok"], "Requests"), 3.0, 0.0)
    written.close()
    (tmp_path / "counter_2.db").touch()
    samples = [s for family in SharedFiles(str(tmp_path)).collect() for s in family.samples]
    assert [(s.name, s.labels, s.value) for s in samples] == [("gpt2deploy_requests_total", {"outcome": "ok"}, 3.0)]
