"""The HTTP service, as a client meets it: a real uvicorn server in its own process on a loopback
port, real requests, answers checked against the runtime called directly."""

import json
import random
import threading
import time

import pytest
import torch

from pipeline.runtime.generate import Generator
from pipeline.runtime.loader import open_backend
from pipeline.runtime.sampling import Sampling
from pipeline.tokenizer import load_tokenizer

httpx = pytest.importorskip("httpx", reason="the [serve] extra is not installed")
pytest.importorskip("fastapi", reason="the [serve] extra is not installed")

from tests.limits import values_past_the_limits  # noqa: E402
from tests.serve.conftest import LONG  # noqa: E402


def test_health_says_what_is_loaded(server):
    url, _ = server
    body = httpx.get(f"{url}/health").json()
    assert body.items() >= {"status": "ok", "backend": "ort", "precision": "fp32", "device": "cpu", "context": 256,
                            "scheduler": "serial"}.items()
    assert body["startup_s"] >= 0 and httpx.get(f"{url}/ready").json() == {"ready": True}


def test_generate_matches_the_runtime(server):
    url, run = server
    prompts = ["Return the number of", "This module"]
    reply = httpx.post(f"{url}/generate", json={"prompt": prompts, "max_new_tokens": 6}, timeout=60)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    tok = load_tokenizer(run.checkpoint)
    local = Generator(open_backend(run, "ort", "fp32", torch.device("cpu")), tok.eos_token_id).generate(
        [tok(p)["input_ids"] for p in prompts], Sampling(max_new_tokens=6, stop_tokens=(tok.eos_token_id,)))
    assert body["tokens"] == local
    assert body["completions"] == [tok.decode([t for t in row if t != tok.eos_token_id]) for row in local]
    assert body["usage"]["completion_tokens"] == sum(map(len, local))


def test_seeded_sampling_repeats(server):
    url, _ = server
    request = {"prompt": "The", "max_new_tokens": 5, "do_sample": True, "temperature": 0.9, "top_p": 0.9, "seed": 4}
    first, second = (httpx.post(f"{url}/generate", json=request, timeout=60).json() for _ in range(2))
    assert first["tokens"] == second["tokens"]


def test_stream_sends_the_new_tokens_then_done(server):
    url, _ = server
    request = {"prompt": "Return", "max_new_tokens": 4, "ignore_eos": True}
    whole = httpx.post(f"{url}/generate", json=request, timeout=60).json()
    with httpx.stream("POST", f"{url}/generate", json={**request, "stream": True}, timeout=60) as reply:
        assert reply.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in reply.iter_lines() if line]
    data = [json.loads(line[6:]) for line in lines if line.startswith("data: {\"tokens\"")]
    assert 1 <= len(data) <= 4 and [t for d in data for t in d["tokens"][0]] == whole["tokens"][0]
    assert whole["finish_reasons"] == ["length"] and len(whole["tokens"][0]) == 4
    assert lines[-2:] == ["event: done", "data: {}"]


def test_batch_generate_answers_each_prompt_as_generate_does(server):
    url, _ = server
    prompts = ["Return the number of", "This module"]
    single = httpx.post(f"{url}/generate", json={"prompt": prompts, "max_new_tokens": 5}, timeout=60).json()
    batch = httpx.post(f"{url}/batch_generate", json={"prompts": prompts, "max_new_tokens": 5}, timeout=60).json()
    assert [r["tokens"] for r in batch["results"]] == single["tokens"]
    assert [r["text"] for r in batch["results"]] == single["completions"]
    assert [r["finish_reason"] for r in batch["results"]] == single["finish_reasons"]


def test_stream_events_carry_only_the_new_text(server):
    """Each event holds the text its token adds, so the events add up to the whole completion."""
    url, _ = server
    request = {"prompt": ["Return the number of", "This"], "max_new_tokens": 24}
    whole = httpx.post(f"{url}/generate", json=request, timeout=60).json()["completions"]
    with httpx.stream("POST", f"{url}/generate", json={**request, "stream": True}, timeout=60) as reply:
        data = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: {\"tokens\"")]
    assert ["".join(d["text"][row] for d in data) for row in range(2)] == whole
    assert max(len(t) for d in data for t in d["text"]) < max(map(len, whole))


@pytest.mark.parametrize("request_body, status, message", [
    ({"prompt": ""}, 400, "prompt 0 is empty"),
    ({"prompt": "hi", "top_p": 1.5}, 422, "top_p: Input should be less than or equal to 1"),
    ({"prompt": "hi", "do_sample": True, "temperature": 0}, 400, "must be > 0 when sampling"),
    ({"prompt": "hi", "max_new_tokens": 5000}, 400, "exceeds the model's context of 256"),
    ({"prompt": "hi", "max_new_tokens": 0}, 422, "greater than or equal to 1"),
    ({"prompt": "hi", "temperature": 2.5}, 422, "temperature: Input should be less than or equal to 2"),
    ({"text": "hi"}, 422, "prompt"),
])
def test_bad_requests_get_a_clear_error(server, request_body, status, message):
    url, _ = server
    reply = httpx.post(f"{url}/generate", json=request_body, timeout=30)
    assert reply.status_code == status and message in reply.text


@pytest.mark.parametrize("field, value", values_past_the_limits())
def test_both_routes_refuse_every_value_past_the_limits_naming_the_field(server, field, value):
    """One table of limits (sampling.LIMITS) for every front door: the CLI and the Triton model refuse
    the same values (tests/runtime/test_sampling.py, tests/tritonserver/test_repository.py)."""
    url, _ = server
    openai_field = "max_tokens" if field == "max_new_tokens" else field
    model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    for path, body in (("/generate", {"prompt": "hi", field: value}),
                       ("/v1/completions", {"model": model, "prompt": "hi", openai_field: value})):
        reply = httpx.post(f"{url}{path}", content=json.dumps(body), headers={"content-type": "application/json"},
                           timeout=30)
        name = field if path == "/generate" else openai_field
        assert reply.status_code in (400, 422) and name in reply.json()["error"]["message"], (path, reply.text)


@pytest.mark.parametrize("body, status, message", [
    ('{"prompt": "hi", "temperature": NaN, "do_sample": true}', 422, "temperature: Input should be a finite number"),
    ('{"prompt": "hi", "temperature": Infinity}', 422, "temperature: Input should be a finite number"),
    ('{"prompt": "hi", "top_p": NaN}', 422, "top_p"),
    ('{"prompt": "\\ud800"}', 400, "prompt 0 is not valid UTF-8"),
    ('{"prompt": "hi \\udcff"}', 400, "prompt 0 is not valid UTF-8"),
    ('{"prompt": "\\ud800", "\\ud800": NaN}', 422, "Input should be"),
    ('{"prompt": "hi", "seed": 18446744073709551616}', 422, "seed: Input should be less than"),
    ('{"prompt": "hi", "do_sample": "yes"}', 422, "do_sample: Input should be a valid boolean"),
    ('{"prompt": "hi", "max_new_tokens": true}', 422, "max_new_tokens: Input should be a valid integer"),
    ('{"prompt": "hi", "max_tokens": 4}', 422, "max_tokens: Extra inputs are not permitted"),
    ('{"prompt": "hi", "repetition_penalty": 1e999}', 422, "repetition_penalty: Input should be a finite number"),
    ('{"prompt": "hi"', 422, "body: not valid JSON (Expecting ',' delimiter at character 15)"),
    ('[1, 2]', 422, "Input should be a valid dictionary"),
])
def test_hostile_values_get_a_4xx_naming_the_field(server, body, status, message):
    url, _ = server
    reply = httpx.post(f"{url}/generate", content=body.encode("utf-8"), headers={"content-type": "application/json"},
                       timeout=30)
    assert reply.status_code == status and message in reply.json()["error"]["message"], reply.text


@pytest.mark.parametrize("path", ["/generate", "/v1/completions"])
@pytest.mark.parametrize("body", [b'\xff\xfe{"prompt": "hi"}', b"[" * 10000 + b"]" * 10000,
                                  b'{"prompt": "hi", "seed": ' + b"7" * 5000 + b"}", b'{"prompt": "hi",}'],
                         ids=["not-utf8", "nested-10000-deep", "5000-digit-integer", "syntax-error"])
def test_a_body_that_is_not_json_gets_openais_error_shape_without_a_param(server, path, body):
    url, _ = server
    reply = httpx.post(f"{url}{path}", content=body, headers={"content-type": "application/json"}, timeout=30)
    error = reply.json()["error"]
    assert 400 <= reply.status_code < 500 and error["param"] is None and error["message"].startswith("body: ")
    assert error["type"] == "invalid_request_error", reply.text


def test_an_unknown_path_gets_openais_error_shape(server):
    url, _ = server
    reply = httpx.get(f"{url}/v1/nothing", timeout=30)
    assert reply.status_code == 404 and reply.json()["error"]["type"] == "NotFoundError"


def test_bounded_fuzz_never_gets_a_5xx_and_health_stays_up(server):
    """Random and hostile bodies (wrong types, huge and non-finite numbers, lone surrogates, deep
    nesting, large bodies): every reply is a 4xx or a 200, and /health answers throughout."""
    url, _ = server
    rng = random.Random(0)
    values = [None, True, "yes", -1, 0, 2**64, -2**70, 1e308, 1.5, "NaN", [], {}, [1, "a"], "\ud800", "x" * 5000,
              {"a": [{"b": None}]}, "\u0000", 0.0, -0.0]
    keys = ["prompt", "max_new_tokens", "do_sample", "temperature", "top_k", "top_p", "repetition_penalty", "seed",
            "stream", "extra", "\udcff"]
    raw = ['{"prompt": "hi", "temperature": NaN}', '{"prompt": "hi", "top_k": -Infinity}', '{"prompt": "\\ud800x"}',
           '{' * 5000, '"just a string"', 'null', '{"prompt": ["a", "\\udfff"]}', '{"prompt": "hi", "seed": 1e400}']
    bodies = [r.encode() for r in raw]
    for _ in range(150):
        body = {k: rng.choice(values) for k in rng.sample(keys, rng.randint(0, 5))}
        if rng.random() < 0.6:
            body["prompt"] = rng.choice(["hi", ["a", "b"], "", "\ud800", 7])
        bodies.append(json.dumps(body).encode())
    bodies.append(b'{"prompt": "' + b"a" * (2 << 20) + b'"}')  # over the body cap
    for i, body in enumerate(bodies):
        reply = httpx.post(f"{url}/generate", content=body, headers={"content-type": "application/json"}, timeout=60)
        assert reply.status_code < 500, (body[:200], reply.text)
        if i % 20 == 0:
            assert httpx.get(f"{url}/health", timeout=2).status_code == 200


def test_a_dropped_stream_frees_the_server_at_once(server):
    """A client reads three events of a long stream and drops the connection: the next request is
    answered as if the server were idle."""
    url, _ = server
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", f"{url}/generate", json={**LONG, "stream": True}) as reply:
            events = 0
            for line in reply.iter_lines():
                events += line.startswith("data: {")
                if events == 3:
                    break
    started = time.monotonic()
    reply = httpx.post(f"{url}/generate", json={"prompt": "hi", "max_new_tokens": 2}, timeout=30)
    assert reply.status_code == 200 and time.monotonic() - started < 1.0


def test_a_client_that_gives_up_frees_the_server(server):
    url, _ = server
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/generate", json=LONG, timeout=0.5)
    started = time.monotonic()
    reply = httpx.post(f"{url}/generate", json={"prompt": "hi", "max_new_tokens": 2}, timeout=30)
    assert reply.status_code == 200 and time.monotonic() - started < 1.0


def test_docs_are_off_unless_asked_for(server):
    url, _ = server
    assert httpx.get(f"{url}/docs").status_code == 404 and httpx.get(f"{url}/openapi.json").status_code == 404


def test_a_body_over_the_cap_gets_413_before_it_is_read(tight_server):
    started = time.monotonic()
    reply = httpx.post(f"{tight_server}/generate", content=b"x" * (12 << 20), headers={"content-type": "application/json"},
                       timeout=30)
    assert reply.status_code == 413 and "over 4096 bytes" in reply.json()["error"]["message"]
    chunked = httpx.post(f"{tight_server}/generate", content=(b"y" * 1024 for _ in range(64)),
                         headers={"content-type": "application/json"}, timeout=30)  # no Content-Length
    assert chunked.status_code == 413 and time.monotonic() - started < 10


def test_a_full_queue_gets_429_with_retry_after_and_a_long_request_504(tight_server):
    """With one request running and one waiting, the next is refused at once; the running one is
    stopped at the server's time limit."""
    replies = {}
    # about 15 s of work on a 2-core CPU: LONG alone (0.9 s) finished inside the 1 s limit on a quiet machine
    slow = {**LONG, "do_sample": True, "repetition_penalty": 1.2, "ignore_eos": True}

    def send(name):
        replies[name] = httpx.post(f"{tight_server}/generate", json=slow, timeout=30)

    def gauges() -> dict[str, float]:
        lines = httpx.get(f"{tight_server}/metrics", timeout=10).text.splitlines()
        return {line.split()[0]: float(line.split()[1]) for line in lines
                if line.startswith(("gpt2deploy_requests_running", "gpt2deploy_requests_waiting"))}

    threads = [threading.Thread(target=send, args=(name,)) for name in ("running", "waiting")]
    deadline = time.monotonic() + 10
    for t in threads:  # the second once the first has left the queue (the cap counts requests not started)
        t.start()
        while t is threads[0] and gauges()["gpt2deploy_requests_running"] != 1.0 and time.monotonic() < deadline:
            time.sleep(0.02)
    # the queue is full once the server counts both (on a busy machine the second may arrive late)
    while list(gauges().values()) != [1.0, 1.0] and time.monotonic() < deadline:
        time.sleep(0.02)
    refused = httpx.post(f"{tight_server}/generate", json={"prompt": "hi", "max_new_tokens": 2}, timeout=30)
    for t in threads:
        t.join()
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert replies["running"].status_code == 504 and "limit of 1 s" in replies["running"].json()["error"]["message"]
    # the waiting one timed out before it started: once idle, neither gauge holds either request
    now = {}
    for _ in range(50):
        now = gauges()
        if now and not any(now.values()):
            break
        time.sleep(0.2)
    assert now and not any(now.values()), now


def test_a_body_or_head_that_stops_arriving_gets_408_and_does_not_hold_a_drain(exported_run, tmp_path):
    """Clients that send 9 of a declared 100 bytes and stall: each gets 408 once the body timeout passes;
    a head sent a byte at a time, or nothing at all, gets 408 once the head timeout passes; a SIGTERM
    meanwhile stops the server without waiting for them."""
    import signal
    import socket

    from tests.serve.conftest import start_server

    _, run, _ = exported_run
    proc, url = start_server(run, tmp_path / "server.log", "--set", "serve.body_timeout_s=1",
                             "--set", "serve.header_timeout_s=1")
    port = int(url.rsplit(":", 1)[1])
    slow = []
    for _ in range(3):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /generate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n"
                  b'{"prompt"')
        slow.append(s)
    for s in slow:
        s.settimeout(10)
        reply = b""
        while b"stopped arriving" not in reply:  # the head and the body may come in separate reads
            part = s.recv(4096)
            if not part:
                break
            reply += part
        assert reply.startswith(b"HTTP/1.1 408") and b"stopped arriving for 1 s" in reply, reply
    # a request head sent a byte at a time, slower than the head timeout allows, and a connection that
    # sends nothing: each gets 408 and is closed; a request sent whole meanwhile is answered
    started = time.monotonic()  # before the connections: their head timers start as they open
    trickle, silent = socket.create_connection(("127.0.0.1", port)), socket.create_connection(("127.0.0.1", port))
    head, reply = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n", b""
    trickle.settimeout(0.3)
    for byte in head[:-2]:
        try:
            trickle.sendall(bytes([byte]))
            reply += trickle.recv(4096)
        except (TimeoutError, OSError):
            pass
        if reply or time.monotonic() - started > 10:
            break
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200
    assert reply.startswith(b"HTTP/1.1 408") and b"did not arrive whole within 1 s" in reply, reply
    assert 0.95 <= time.monotonic() - started < 5  # the server's timer may fire a hair early by this clock
    silent.settimeout(5)
    assert silent.recv(4096).startswith(b"HTTP/1.1 408")
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /generate HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{")
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0 and time.monotonic() - started < 10
    s.close()


def test_a_runtime_with_a_row_bound_caps_a_requests_prompts_at_it(exported_run, tmp_path):
    """onnxruntime-genai takes 32 rows a generator: served on it, a request of 33 prompts is refused
    up front (it reached the runtime, which failed it), and one within the bound is answered; what
    else it cannot do (prompts of several lengths, several sampled rows) is a 400 saying so (was 500)."""
    pytest.importorskip("onnxruntime_genai", reason="the onnxruntime-genai test needs the [dev] extra")
    from tests.serve.conftest import start_server

    _, run, _ = exported_run
    _, url = start_server(run, tmp_path / "server.log", "--backend", "ort-genai")
    assert httpx.get(f"{url}/health").json().items() >= {"runtime_max_rows": 32, "max_prompts": 32}.items()
    refused = httpx.post(f"{url}/batch_generate", json={"prompts": ["The"] * 33, "max_new_tokens": 2}, timeout=60)
    assert refused.status_code == 400 and "give 1 to 32 prompts" in refused.text, refused.text
    answered = httpx.post(f"{url}/batch_generate", json={"prompts": ["The"] * 2, "max_new_tokens": 2}, timeout=60)
    assert answered.status_code == 200 and len(answered.json()["results"]) == 2, answered.text
    # what this runtime cannot do is the request's to change (400 saying what), not a server error
    for request, says in (({"prompts": ["The", "A long one"]}, "give it prompts of one length"),
                          ({"prompts": ["The"] * 2, "do_sample": True}, "several prompts decode greedily")):
        reply = httpx.post(f"{url}/batch_generate", json={**request, "max_new_tokens": 2}, timeout=60)
        assert reply.status_code == 400 and says in reply.text, reply.text
