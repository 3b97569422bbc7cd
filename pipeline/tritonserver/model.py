"""The generation model of a Triton Inference Server repository: `gpt2-deploy package --format triton`
copies this file there as <model>/1/model.py, beside the run it serves (<model>/1/run). It runs on
Triton's Python backend, decoupled. Each model instance starts this project's engine process
(pipeline.engine_process: the backend the repository was packaged for, on the instance's device, and
its continuous scheduler, as `gpt2-deploy serve` runs them), so this process only turns requests into
jobs and the engine's token messages into responses: with the scheduler in this process, it and the
response sender shared one GIL and the engine gave 38% of serve's tokens/s at 64 clients
(docs/journal/performance.md, "Sampling: the check over the GPU; Triton served"). A response is a
round trip to the server, so SENDERS threads send them, each for its share of the requests.

Requests come through Triton's generate endpoints (or its gRPC stream), with TensorRT-LLM's names:
text_input, and optional max_tokens, temperature (absent or 0: greedy), top_p, top_k, seed, stop,
repetition_penalty, presence_penalty, frequency_penalty, stream, ignore_eos. With stream true a request gets a
response for each step (the text and tokens it adds; those of several steps in one when its sender
thread falls behind), else one at its end; its last response carries finish_reason, "stop" or "length". A
value out of range is refused with a message naming it (the limits of sampling.LIMITS, serve's own).
A client that goes away has its row freed at the engine's next step. Each instance's requests taken,
tokens generated, requests waiting for rows and running are the metrics gpt2deploy_requests,
gpt2deploy_generation_tokens, gpt2deploy_requests_waiting and gpt2deploy_requests_running on Triton's
metrics port."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from pipeline.artifacts import RunDir
from pipeline.engine_process.messages import STARTED, Cancel, End, EngineSpec, Submit
from pipeline.engine_process.parent import EngineProcess
from pipeline.errors import UserError
from pipeline.runtime.generate import check_length
from pipeline.runtime.sampling import Sampling, refuse_out_of_range
from pipeline.runtime.text_output import RowOutput
from pipeline.tokenizer import encode, load_tokenizer, token_bytes

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# each optional input: its default, and the Sampling field whose limits (sampling.LIMITS) it takes
SETTINGS = {"max_tokens": (16, "max_new_tokens"), "temperature": (0.0, "temperature"), "top_p": (1.0, "top_p"),
            "top_k": (0, "top_k"), "seed": (None, "seed"), "repetition_penalty": (1.0, "repetition_penalty"),
            "presence_penalty": (0.0, "presence_penalty"), "frequency_penalty": (0.0, "frequency_penalty")}


# response round trips in flight at once: a send blocks its thread (the GIL released) until the server
# has taken the response, so one sender thread held 64 streams to ~4,800 tokens/s (docs/journal/performance.md)
SENDERS = 16
STOPPED = object()  # the item that tells a sender the engine has gone
METRICS_EVERY_S = 0.1  # how often the metrics follow the steps (a request's start and end show at once)


class Sender(threading.Thread):
    """One of the threads that send responses: the requests whose id is its index modulo SENDERS, so a
    request's responses leave in order. What arrives while it sends waits for its next pass, which
    answers each request once (coalescing the steps it fell behind by)."""

    def __init__(self, answer, index: int):
        super().__init__(name=f"responses-{index}", daemon=True)
        self.answer, self.index, self.pending, self.arrived = answer, index, [], threading.Condition()
        self.start()

    def put(self, items: list) -> None:
        with self.arrived:
            self.pending += items
            self.arrived.notify()

    def run(self) -> None:
        while True:
            with self.arrived:
                while not self.pending:
                    self.arrived.wait()
                items, self.pending = self.pending, []
            self.answer(items, self.index)
            if items[-1][1] is STOPPED:
                return


@dataclass(eq=False)
class InFlight:
    """One request in flight: its text so far, whether it streams, and where its responses go."""
    id: int
    sender: object  # pb_utils.InferenceResponseSender
    cancelled: object  # () -> bool: the client has gone
    row: RowOutput
    stream: bool
    started: bool = False
    done: bool = False


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        parameters = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        device = "cpu" if args["model_instance_kind"] == "CPU" else f"cuda:{args['model_instance_device_id']}"
        run = RunDir(Path(args["model_repository"]) / args["model_version"] / "run")
        self.tokenizer = load_tokenizer(run.checkpoint)
        self.eos, self.table = self.tokenizer.eos_token_id, token_bytes(self.tokenizer)
        # the stub embeds Python: the engine process is spawned from this environment's interpreter
        multiprocessing.set_executable(str(Path(sys.exec_prefix) / "bin" / "python3"))
        spec = EngineSpec(run.root.resolve(), parameters["backend"], parameters["precision"], device,
                          int(parameters["max_rows"]), continuous=True)
        self.engine = EngineProcess(spec, self.eos)
        self.commands, self.results = self.engine.channels[0]
        self.context = self.engine.info["context"]
        self.inflight: dict[int, InFlight] = {}
        self.ids, self.sending = itertools.count(), threading.Lock()
        labels = {"model": args["model_name"], "instance": args["model_instance_name"]}
        gauge, counter = pb_utils.MetricFamily.GAUGE, pb_utils.MetricFamily.COUNTER
        # the families outlive their metrics (Triton refuses a metric whose family has gone)
        self.families = {name: pb_utils.MetricFamily(f"gpt2deploy_{name}", about, kind) for name, about, kind in [
            ("requests_waiting", "Requests queued for rows, not yet running", gauge),
            ("requests_running", "Requests generating now", gauge),
            ("requests", "Generation requests this instance took", counter),
            ("generation_tokens", "Tokens this instance generated", counter)]}
        self.waiting, self.running, self.taken, self.generated = (f.Metric(labels) for f in self.families.values())
        self.unreported, self.reported_at = 0, 0.0  # tokens not yet in `generated`, and when the metrics were set
        self.senders = [Sender(self.answer_items, i) for i in range(SENDERS)]
        self.reader = threading.Thread(target=self.read, name="engine-reader", daemon=True)
        self.reader.start()

    def execute(self, requests: list) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                state, prompt, sampling = self.job(request, sender)
            except Exception as e:  # the request's error (400 on HTTP); the others in this call go on
                sender.send(_error(e), flags=FINAL)
                continue
            with self.sending:
                self.inflight[state.id] = state
                self.taken.increment(1)
                self.report(now=True)
                self.commands.send(Submit(state.id, [prompt], sampling))
        return None

    def send(self, message: Cancel | End) -> None:
        with self.sending:
            self.commands.send(message)

    def report(self, now: bool) -> None:
        """The metrics from the requests in flight (called holding `sending`): with `now`, at once, else at
        most every METRICS_EVERY_S. Each metric call is a round trip to the server that holds this
        process's GIL: set every step, they held one client's chunks 3.7-5.5 ms apart where 0.4-0.7
        without (docs/journal/performance.md)."""
        moment = time.monotonic()
        if not now and moment - self.reported_at < METRICS_EVERY_S:
            return
        if self.unreported:
            self.generated.increment(self.unreported)
            self.unreported = 0
        waiting = sum(not s.started for s in self.inflight.values())
        self.waiting.set(waiting)
        self.running.set(len(self.inflight) - waiting)
        self.reported_at = moment

    def job(self, request, sender) -> tuple[InFlight, list[int], Sampling]:
        """The request as a job for the engine, its values checked first."""
        text = _strings(request, "text_input")
        if len(text) != 1:
            raise UserError(f"text_input: one prompt a request, got {len(text)}")
        values = {}
        for name, (default, field) in SETTINGS.items():
            value = _scalar(request, name, default)
            if value is not None:
                refuse_out_of_range(name, value, field)
            values[name] = value
        stream = bool(_scalar(request, "stream", False))
        ignore_eos = bool(_scalar(request, "ignore_eos", False))  # vLLM's: every request its whole length (load tests)
        sampling = Sampling.from_openai(values.pop("max_tokens"), values.pop("temperature"),
                                        () if ignore_eos else (self.eos,), **values)
        sampling.check()
        prompt = encode(self.tokenizer, text[0], "text_input")
        check_length(len(prompt), sampling.max_new_tokens, self.context, "max_tokens")
        state = InFlight(next(self.ids), sender, request.is_cancelled,
                         RowOutput(self.table, sampling, tuple(_strings(request, "stop"))), stream)
        return state, prompt, sampling

    def read(self) -> None:
        """The reader thread: every message the engine has sent (a step's items, each to its request),
        taken at once, each item handed to its request's sender; the metrics now and then (report)."""
        while True:
            try:
                messages = [self.results.recv()]
                while self.results.poll():  # behind: the steps since, in one pass
                    messages.append(self.results.recv())
            except (EOFError, OSError):  # the engine has stopped: finalize, or it died
                break
            routed: dict[Sender, list] = {}
            tokens = 0
            for job_id, item in itertools.chain.from_iterable(messages):
                state = self.inflight.get(job_id)
                if state is None:
                    continue
                if item == STARTED:
                    state.started = True
                    continue
                tokens += isinstance(item, tuple)
                routed.setdefault(self.senders[state.id % SENDERS], []).append((state, item))
            for sender, items in routed.items():
                sender.put(items)
            with self.sending:
                self.unreported += tokens
                self.report(now=False)
        for sender in self.senders:
            sender.put([(None, STOPPED)])
            sender.join(30)

    def answer_items(self, items: list, index: int) -> None:
        """Sender `index`'s pass: its requests' items since its last pass applied, then one response a
        request (the tokens of all the steps it covers); those done leave the requests in flight. After
        STOPPED (the engine has gone) its requests still in flight end with an error."""
        touched = {}
        for state, item in items:
            if item is STOPPED or state.done:
                continue
            if isinstance(item, Exception):
                state.done = True
                state.sender.send(_error(item), flags=FINAL)
            elif item is None:  # the job ended: a row not finished yet has its length
                if state.row.finish is None:
                    state.row.end("length")
            else:
                state.row.add(item[0])
            touched[state.id] = state
        for state in touched.values():
            self.answer(state)
        with self.sending:
            ended = [job_id for job_id, state in touched.items() if state.done]
            for job_id in ended:
                del self.inflight[job_id]
            if ended:  # the reader reports only as messages come: the last ones' end must show
                self.report(now=True)
            left = [s for s in self.inflight.values() if s.id % SENDERS == index] if items[-1][1] is STOPPED else []
        for state in left:
            state.done = True
            state.sender.send(_error(RuntimeError("the engine process stopped")), flags=FINAL)

    def answer(self, state: InFlight) -> None:
        """What the request's new tokens call for: its end (cancelled, or finished) or, streaming, its new text."""
        if state.done:
            return
        if state.cancelled():  # its row leaves at the engine's next step
            self.send(Cancel(state.id))
            state.done = True
            state.sender.send(flags=FINAL)
        elif state.row.finish is not None:
            if state.row.finish == "stop":  # a stop string (or token): its row leaves at the next step
                self.send(End(state.id, 0))
            state.done = True
            state.sender.send(self.response(state), flags=FINAL)
        elif state.stream:
            state.sender.send(self.response(state))

    def response(self, state: InFlight):
        """What the request has not been sent yet when it streams, else all of it; the stop token is no
        part of either (as `gpt2-deploy generate` prints it)."""
        row = state.row
        text, tokens = (row.new_text(), row.new_tokens()) if state.stream else (row.text, row.tokens)
        outputs = [pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_)),
                   pb_utils.Tensor("output_ids", np.array([t for t in tokens if t != self.eos], dtype=np.int32))]
        if row.finish is not None:
            outputs.append(pb_utils.Tensor("finish_reason", np.array([row.finish.encode()], dtype=np.object_)))
        return pb_utils.InferenceResponse(outputs)

    def finalize(self) -> None:
        """The engine stops once its command pipe is closed, its jobs with it; then the reader ends."""
        self.engine.close()
        self.reader.join(30)


def _error(e: Exception):
    """A request's error response: a UserError's line as it is, anything else with its type."""
    message = str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}"
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))


def _strings(request, name: str) -> list[str]:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return []
    try:
        return [v.decode() if isinstance(v, bytes) else str(v) for v in tensor.as_numpy().reshape(-1)]
    except UnicodeDecodeError:
        raise UserError(f"{name}: not valid UTF-8") from None


def _scalar(request, name: str, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    values = tensor.as_numpy().reshape(-1)
    if values.size != 1:
        raise UserError(f"{name}: one value, got {values.size}")
    return values[0].item()
