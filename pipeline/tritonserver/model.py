"""The generation model of a Triton Inference Server repository: `gpt2-deploy package --format triton`
copies this file there as <model>/1/model.py, beside the run it serves (<model>/1/run). It runs on
Triton's Python backend, decoupled, and drives this project's runtime: the backend the repository
was packaged for and its scheduler, with continuous batching across the requests in flight.

Requests come through Triton's generate endpoints (or its gRPC stream), with TensorRT-LLM's names:
text_input, and optional max_tokens, temperature (absent or 0: greedy), top_p, top_k, seed, stop,
repetition_penalty, presence_penalty, frequency_penalty, stream, ignore_eos. With stream true a request gets a
response for each step (the text and tokens it adds; those of several steps in one when the sender
falls behind), else one at its end; its last response carries
finish_reason, "stop" or "length". A value out of range is refused with a message naming it.

The scheduler runs on a thread of its own and hands each step to a sender thread, which turns tokens
into text and talks to Triton, so the steps never wait on the server's responses."""

from __future__ import annotations

import json
import queue
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from pipeline.artifacts import RunDir
from pipeline.errors import UserError
from pipeline.runtime.generate import check_length
from pipeline.runtime.jobs import Inbox, Job
from pipeline.runtime.sampling import Sampling, refuse_out_of_range
from pipeline.runtime.scheduler import make_scheduler
from pipeline.runtime.session import open_session
from pipeline.runtime.text_output import RowOutput
from pipeline.tokenizer import token_bytes

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# each optional input: its default, and the Sampling field whose limits (sampling.LIMITS) it takes
SETTINGS = {"max_tokens": (16, "max_new_tokens"), "temperature": (0.0, "temperature"), "top_p": (1.0, "top_p"),
            "top_k": (0, "top_k"), "seed": (None, "seed"), "repetition_penalty": (1.0, "repetition_penalty"),
            "presence_penalty": (0.0, "presence_penalty"), "frequency_penalty": (0.0, "frequency_penalty")}


@dataclass(eq=False)
class InFlight:
    """One request in flight: its text so far, whether it streams, and where its responses go."""
    sender: object  # pb_utils.InferenceResponseSender
    cancelled: object  # () -> bool: the client has gone
    row: RowOutput
    stream: bool
    job: Job | None = None
    done: bool = False


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        parameters = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        device = "cpu" if args["model_instance_kind"] == "CPU" else f"cuda:{args['model_instance_device_id']}"
        run = RunDir(Path(args["model_repository"]) / args["model_version"] / "run")
        self.session = open_session(run, parameters["backend"], parameters["precision"], torch.device(device))
        self.table = token_bytes(self.session.tokenizer)
        self.inbox, self.deliveries = Inbox(), queue.Queue()
        self.scheduler = make_scheduler(self.session.backend, self.session.eos, int(parameters["max_rows"]),
                                        inbox=self.inbox)
        self.sender = threading.Thread(target=self.send, name="sender", daemon=True)
        self.sender.start()
        self.scheduler.start()

    def execute(self, requests: list) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                self.inbox.submit(self.job(request, sender))
            except Exception as e:  # the request's error (400 on HTTP); the others in this call go on
                sender.send(_error(e), flags=FINAL)
        return None

    def job(self, request, sender) -> Job:
        """The request as a scheduler job, its values checked first."""
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
                                        () if ignore_eos else (self.session.eos,), **values)
        sampling.check()
        prompt = self.session.encode(text[0], "text_input")
        check_length(len(prompt), sampling.max_new_tokens, self.session.backend.n_positions, "max_tokens")
        state = InFlight(sender, request.is_cancelled, RowOutput(self.table, sampling, tuple(_strings(request, "stop"))),
                        stream)
        state.job = Job([prompt], sampling, lambda item: self.deliveries.put((state, item)))
        return state.job

    def send(self) -> None:
        """The sender thread: each step's tokens as text to its request, until finalize. What queued
        while it sent goes out as one response a request: each response is a round trip to the Triton
        server, and one a token a row held 64 streams to 4,500 tokens/s (docs/journal/performance.md)."""
        running = True
        while running:
            deliveries = [self.deliveries.get()]
            while True:
                try:
                    deliveries.append(self.deliveries.get_nowait())
                except queue.Empty:
                    break
            touched = {}
            for delivery in deliveries:
                if delivery is None:
                    running = False
                    continue
                state, item = delivery
                if state.done:
                    continue
                if isinstance(item, Exception):
                    state.done = True
                    state.sender.send(_error(item), flags=FINAL)
                elif item is None:  # the job ended: a row not finished yet has its length
                    if state.row.finish is None:
                        state.row.end("length")
                else:
                    state.row.add(item[0])
                touched[id(state)] = state
            for state in touched.values():
                self.answer(state)

    def answer(self, state: InFlight) -> None:
        """What the request's new tokens call for: its end (cancelled, or finished) or, streaming, its new text."""
        if state.done:
            return
        if state.cancelled():
            state.job.cancelled.set()
            state.done = True
            state.sender.send(flags=FINAL)
        elif state.row.finish is not None:
            state.job.end(0)  # a stop string: its row leaves at the next step
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
                   pb_utils.Tensor("output_ids", np.array([t for t in tokens if t != self.session.eos], dtype=np.int32))]
        if row.finish is not None:
            outputs.append(pb_utils.Tensor("finish_reason", np.array([row.finish.encode()], dtype=np.object_)))
        return pb_utils.InferenceResponse(outputs)

    def finalize(self) -> None:
        self.inbox.close()
        self.scheduler.thread.join()
        self.deliveries.put(None)
        self.sender.join()


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
