"""`package --format triton` on the micro run with its TensorRT-RTX plans, then the real `tritonserver`
that nvidia-pytriton carries (`make triton-env`) started on the repository: the generation model's
greedy tokens against this project's own generation, streamed and whole, a seeded sampled request
twice, values refused with Triton's error shape. The raw graphs' configs are read against the
contract; the Python-only binary has no onnxruntime or TensorRT backend to load them, so the test
checks that the server parses each and fails on that backend alone."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

from pipeline.contract import Contract
from pipeline.errors import UserError
from pipeline.runtime.sampling import Sampling
from pipeline.runtime.session import open_session
from pipeline.tritonserver.repository import package_triton
from tests.conftest import ENGINE_PRECISIONS, copy_run
from tests.limits import values_past_the_limits

REPO_ROOT = Path(__file__).resolve().parents[2]
TRITON_PYTHON = REPO_ROOT / ".venv-triton" / "bin" / "python"
PROMPT = "The history of the city"
LONG = 240  # tokens of a request that is left mid-stream (the micro run's context is 256)


@pytest.fixture(scope="module")
def packaged(engines, tmp_path_factory):
    _, run, _ = engines
    run = copy_run(run, tmp_path_factory.mktemp("triton") / "run")
    return run, package_triton(run, "ort", "fp32", "cpu", "gpt2", max_rows=8, instances=2)


def test_the_repository_holds_the_generation_model_every_graph_and_plan_and_is_up_to_date_after(packaged, capsys):
    run, repository = packaged
    models = sorted(p.parent.name for p in repository.glob("*/config.pbtxt"))
    assert models == sorted(["gpt2"] + [f"gpt2-{kind}-{p}" for kind in ("onnx", "trt") for p in ENGINE_PRECISIONS])
    version = repository / "gpt2" / "1"
    assert (version / "model.py").read_text() == (REPO_ROOT / "pipeline" / "tritonserver" / "model.py").read_text()
    assert (version / "run" / "onnx" / "fp32" / "model.onnx").is_file() and (version / "run" / "manifest.json").is_file()
    assert (repository / "gpt2" / "tokenizer" / "tokenizer.json").is_file()
    config = (repository / "gpt2-trt-fp16" / "config.pbtxt").read_text()
    assert 'platform: "tensorrt_plan"' in config and re.search(r'key: "8\.6" value: "[^"]+fp16[^"]*\.plan"', config)
    before = (repository / "README.md").stat().st_ino
    assert package_triton(run, "ort", "fp32", "cpu", "gpt2", max_rows=8, instances=2) == repository
    assert "up to date" in capsys.readouterr().out and (repository / "README.md").stat().st_ino == before


def test_triton_int8_wo_carries_the_graph_its_weights_come_from(engines, tmp_path):
    """The triton backend's int8-wo reads its weights from the int8-wo graph (BackendSpec.graph_weights):
    the generation model's run holds that graph beside the checkpoint; fp16 needs only the checkpoint."""
    _, run, _ = engines
    run = copy_run(run, tmp_path / "run")
    for precision, graph in (("int8-wo", True), ("fp16", False)):
        repository = package_triton(run, "triton", precision, "cuda", "gpt2", max_rows=8, force=True)
        carried = repository / "gpt2" / "1" / "run"
        assert (carried / "checkpoint" / "config.json").is_file()
        assert (carried / "onnx" / "int8-wo" / "model.onnx").is_file() == graph, precision


def tensors(text: str) -> dict[str, tuple[str, list[int]]]:
    return {m[0]: (m[1], [int(d) for d in m[2].split(",")])
            for m in re.findall(r'name: "([^"]+)" data_type: (\w+) dims: \[ ([-\d, ]+) \]', text)}


@pytest.mark.parametrize("precision", ENGINE_PRECISIONS)
def test_a_raw_graphs_config_is_the_contract_with_the_cache_as_implicit_state(packaged, precision):
    run, repository = packaged
    from transformers import GPT2Config
    contract = Contract.from_hf_config(GPT2Config.from_json_file(str(run.checkpoint / "config.json")))
    text = (repository / f"gpt2-onnx-{precision}" / "config.pbtxt").read_text()
    found = tensors(text)
    assert {n: found[n] for n in ("input_ids", "attention_mask", "position_ids")} == {
        n: ("TYPE_INT64", [-1]) for n in ("input_ids", "attention_mask", "position_ids")}
    assert found["logits"][1] == [-1, contract.vocab_size]
    states = re.findall(r'input_name: "([^"]+)" output_name: "([^"]+)" data_type: (\w+) dims: \[ ([-\d, ]+) \]', text)
    assert [(s[0], s[1]) for s in states] == list(zip(contract.past_names, contract.present_names))
    assert {s[3] for s in states} == {f"{contract.n_head}, -1, {contract.head_dim}"}
    assert "max_batch_size: 1" in text and (repository / f"gpt2-onnx-{precision}" / "1" / "model.onnx").is_file()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict) -> tuple[int, str]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture(scope="module")
def server(packaged):
    if not TRITON_PYTHON.exists():
        pytest.skip("no .venv-triton: `make triton-env` installs nvidia-pytriton's tritonserver")
    _, repository = packaged
    http, grpc, metrics = free_port(), free_port(), free_port()
    ports = ["--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
    log = open(repository.parent / "tritonserver.log", "w")
    process = subprocess.Popen([str(TRITON_PYTHON), "-m", "pipeline.cli", "triton-server", str(repository), *ports],
                               stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT, start_new_session=True,
                               env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    url = f"http://127.0.0.1:{http}"
    deadline = time.monotonic() + 90
    while True:
        try:
            urllib.request.urlopen(f"{url}/v2/health/ready", timeout=2)
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail("tritonserver did not become ready:\n" + (repository.parent / "tritonserver.log").read_text()[-3000:])
            time.sleep(0.5)
    yield url, process, f"127.0.0.1:{grpc}", f"http://127.0.0.1:{metrics}/metrics"
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=60)
    log.close()


def expected_tokens(run, max_tokens: int) -> list[int]:
    session = open_session(run, "ort", "fp32", torch.device("cpu"))
    prompt = session.encode(PROMPT)
    tokens = session.generator().generate([prompt], Sampling(max_new_tokens=max_tokens, stop_tokens=(session.eos,)))[0]
    return [t for t in tokens if t != session.eos]


def test_generate_and_generate_stream_give_this_projects_greedy_tokens(packaged, server):
    run, _ = packaged
    url, *_ = server
    want = expected_tokens(run, 12)
    status, body = post(f"{url}/v2/models/gpt2/generate", {"text_input": PROMPT, "max_tokens": 12})
    assert status == 200, body
    whole = json.loads(body)
    assert whole["output_ids"] == want and whole["finish_reason"] in ("length", "stop")
    status, body = post(f"{url}/v2/models/gpt2/generate_stream", {"text_input": PROMPT, "max_tokens": 12, "stream": True})
    events = [json.loads(line[len("data: "):]) for line in body.splitlines() if line.startswith("data: ")]
    streamed = [t for e in events for t in (e["output_ids"] if isinstance(e["output_ids"], list) else [e["output_ids"]])]
    # a response a step, or several steps' tokens in one where the sender fell behind the steps; the last says why it ended
    assert status == 200 and streamed == want and len(events) <= len(want)
    assert [("finish_reason" in e) for e in events] == [False] * (len(events) - 1) + [True]
    assert "".join(e["text_output"] for e in events) == whole["text_output"]


def test_a_seeded_sampled_request_repeats_and_bad_values_get_tritons_error_shape(server):
    url, *_ = server
    sampled = {"text_input": PROMPT, "max_tokens": 8, "temperature": 0.9, "top_p": 0.95, "seed": 7}
    first, second = (post(f"{url}/v2/models/gpt2/generate", sampled) for _ in range(2))
    assert first[0] == 200 and json.loads(first[1])["output_ids"] == json.loads(second[1])["output_ids"]
    for body, field in [({"max_tokens": 0}, "max_tokens"), ({"top_p": 1.5}, "top_p"), ({"top_k": -2}, "top_k"),
                        ({"temperature": float("nan")}, "temperature"), ({"max_tokens": 10**6}, "max_tokens")]:
        status, text = post(f"{url}/v2/models/gpt2/generate", {"text_input": PROMPT, **body})
        assert status == 400 and field in json.loads(text)["error"], (body, text)
    # a value of the wrong JSON type is Triton's own to refuse (500, its message), before the model
    status, text = post(f"{url}/v2/models/gpt2/generate", {"text_input": PROMPT, "temperature": "hot"})
    assert status >= 400 and "Unable to parse" in json.loads(text)["error"]
    assert post(f"{url}/v2/models/gpt2/generate", sampled) == second  # and the model serves on, alike


@pytest.mark.parametrize("field, value", values_past_the_limits(largest_int=2**31 - 1))
def test_the_model_refuses_every_value_past_the_limits_naming_the_field(server, field, value):
    """The same values the CLI and serve's routes refuse (one table, sampling.LIMITS); integers past
    INT32 are Triton's own to refuse, before the model."""
    url, *_ = server
    name = "max_tokens" if field == "max_new_tokens" else field
    status, text = post(f"{url}/v2/models/gpt2/generate", {"text_input": PROMPT, name: value})
    assert status == 400 and name in json.loads(text)["error"], text


def test_the_raw_graphs_parse_and_wait_only_for_their_backend(server):
    url, *_ = server
    for model, backend in [("gpt2-onnx-fp16", "onnxruntime"), ("gpt2-trt-fp16", "tensorrt")]:
        status, text = post(f"{url}/v2/repository/models/{model}/load", {})
        assert status == 400 and f"backend library for backend '{backend}'" in text, text


def test_loadtest_measures_the_triton_model_through_generate_stream(server):
    from serve.loadtest import LoadSettings, loadtest
    url, *_ = server
    result = loadtest(LoadSettings(url, [2], prompt_tokens=16, max_tokens=8, duration_s=2, warmup_s=0.5,
                                   triton_model="gpt2", workers=1))
    row = result["rows"][0]
    assert result["server"]["model"] == "gpt2" and not row["errors"] and row["requests"] > 0
    # ignore_eos: every request its length; tokens may come several to a response (the gaps inside one are 0)
    assert row["tokens_per_request"] == 8 and row["tpot_ms"]["p50"] > 0
    with pytest.raises(UserError, match="no Triton model 'gpt3'"):
        loadtest(LoadSettings(url, [1], duration_s=1, triton_model="gpt3"))


def metric(text: str, name: str) -> dict[str, float]:
    """{instance: value} of one of the generation model's metrics in Triton's /metrics text."""
    found = re.findall(rf'^{name}{{([^}}]*)}} ([\d.e+-]+)$', text, re.M)
    return {re.search(r'instance="([^"]+)"', labels)[1]: float(value) for labels, value in found}


def test_tritonclients_grpc_stream_gets_the_greedy_tokens_a_response_a_step(packaged, server):
    """The official client's decoupled stream (gRPC: the generate extension is HTTP's alone)."""
    import numpy as np
    grpcclient = pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] is in the [dev] extra")
    run, _ = packaged
    _, _, grpc_url, _ = server
    responses, done = [], threading.Event()

    def on_response(result, error):
        responses.append(error or result)
        if error or result.get_response().parameters["triton_final_response"].bool_param:
            done.set()

    inputs = []
    for name, value, dtype in [("text_input", np.array([PROMPT.encode()], dtype=np.object_), "BYTES"),
                               ("max_tokens", np.array([12], dtype=np.int32), "INT32"),
                               ("stream", np.array([True]), "BOOL")]:
        inputs.append(grpcclient.InferInput(name, list(value.shape), dtype))
        inputs[-1].set_data_from_numpy(value)
    with grpcclient.InferenceServerClient(grpc_url) as client:
        client.start_stream(callback=on_response)
        client.async_stream_infer("gpt2", inputs, enable_empty_final_response=True)
        assert done.wait(60)
        client.stop_stream()
    assert not [r for r in responses if isinstance(r, Exception)], responses
    tokens = [t for r in responses if r.as_numpy("output_ids") is not None for t in r.as_numpy("output_ids").tolist()]
    assert tokens == expected_tokens(run, 12) and len(responses) > 2


def test_a_client_that_leaves_mid_stream_frees_its_row_and_the_next_request_is_answered(packaged, server):
    run, _ = packaged
    url, _, _, metrics_url = server
    figures = lambda name: sum(metric(urllib.request.urlopen(metrics_url).read().decode(), name).values())  # noqa: E731
    before = figures("gpt2deploy_generation_tokens")
    body = json.dumps({"text_input": PROMPT, "max_tokens": LONG, "stream": True, "ignore_eos": True}).encode()
    request = urllib.request.Request(f"{url}/v2/models/gpt2/generate_stream", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as stream:
        assert stream.readline().startswith(b"data: ")  # it runs; then the client goes
    deadline = time.monotonic() + 30
    while figures("gpt2deploy_requests_running"):
        assert time.monotonic() < deadline, "the left request still runs"
        time.sleep(0.2)
    assert figures("gpt2deploy_generation_tokens") - before < LONG  # it stopped short of its length
    status, text = post(f"{url}/v2/models/gpt2/generate", {"text_input": PROMPT, "max_tokens": 12})
    assert status == 200 and json.loads(text)["output_ids"] == expected_tokens(run, 12)


def test_both_instances_take_requests(server):
    """Two instances, each its own engine process: concurrent requests reach both."""
    from concurrent.futures import ThreadPoolExecutor
    url, _, _, metrics_url = server
    with ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(lambda i: post(f"{url}/v2/models/gpt2/generate", {"text_input": PROMPT, "max_tokens": 24,
                                                                                 "seed": i, "temperature": 0.8}),
                                range(32)))
    assert {status for status, _ in replies} == {200}
    taken = metric(urllib.request.urlopen(metrics_url).read().decode(), "gpt2deploy_requests")
    assert len(taken) == 2 and all(v > 0 for v in taken.values()), taken


def test_the_server_stops_cleanly_on_sigint(server):
    _, process, *_ = server
    os.killpg(process.pid, signal.SIGINT)
    assert process.wait(timeout=60) == 0


@pytest.mark.parametrize("backend, precision, device, name, says", [
    ("triton", "fp16", "cpu", "gpt2", "--device cpu"), ("ort", "fp8", "cpu", "gpt2", "--precision fp8"),
    ("nope", "fp32", "cpu", "gpt2", "--backend nope"), ("ort", "fp32", "cpu", "../up", "--name")])
def test_options_it_cannot_package_are_named_and_nothing_is_written(engines, tmp_path, backend, precision, device, name, says):
    _, run, _ = engines
    run = copy_run(run, tmp_path / "run")
    with pytest.raises(UserError, match=says.replace("-", r"\-")):
        package_triton(run, backend, precision, device, name, max_rows=8)
    assert not (run.root / "triton").exists()


def test_instances_and_gpus_go_into_the_instance_group(engines, tmp_path):
    from pipeline.tritonserver.repository import instance_group
    assert instance_group("cuda", 2, [0, 1]) == "instance_group [ { count: 2 kind: KIND_GPU gpus: [ 0, 1 ] } ]"
    assert instance_group("cpu", 3, None) == "instance_group [ { count: 3 kind: KIND_CPU } ]"
    _, run, _ = engines
    run = copy_run(run, tmp_path / "run")
    with pytest.raises(UserError, match=r"--gpus: this host has no GPU 7 \(it has "):
        package_triton(run, "ort", "fp16", "cuda", "gpt2", max_rows=8, gpus=[0, 7] if torch.cuda.device_count() else [7])
    with pytest.raises(UserError, match="--gpus 0: the generation model runs on the CPU"):
        package_triton(run, "ort", "fp32", "cpu", "gpt2", max_rows=8, gpus=[0])
    assert not (run.root / "triton").exists()
