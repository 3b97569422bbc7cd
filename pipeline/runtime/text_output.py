"""One prompt's generated tokens as text, as a client is sent it: stop tokens, stop strings that may
arrive split over tokens, and the length, shared by the HTTP server (serve.streaming) and the Triton
Inference Server model (pipeline.tritonserver.model)."""

from __future__ import annotations

from pipeline.runtime.sampling import Sampling
from pipeline.tokenizer import TextStream


class RowOutput:
    """One prompt's generated tokens and text. It ends at a stop token (finish "stop"), at the first
    stop string (the text ends before it, "stop") or at its length ("length"). Text that could be
    the start of a stop string is held back until it cannot."""

    def __init__(self, table: list[bytes], sampling: Sampling, stop: tuple[str, ...] = ()):
        self.text_stream, self.stop = TextStream(table), stop
        self.max_tokens, self.stop_tokens = sampling.max_new_tokens, sampling.stop_tokens
        self.hold = max(map(len, stop), default=1) - 1
        self.tokens: list[int] = []
        self.text, self.finish = "", None
        self.sent_tokens = self.sent_text = 0

    def add(self, token: int) -> None:
        if self.finish is not None:  # the scheduler fills a stopped prompt's place in a step
            return
        self.tokens.append(token)
        if token in self.stop_tokens:
            return self.end("stop")
        self.text += self.text_stream.add(token)
        # an occurrence cannot start in text already sent: that text was checked without the held tail
        hits = [i for i in (self.text.find(s, self.sent_text) for s in self.stop) if i >= 0]
        if hits:
            self.text, self.finish = self.text[:min(hits)], "stop"
        elif len(self.tokens) >= self.max_tokens:
            self.end("length")

    def end(self, reason: str) -> None:
        self.finish = reason
        self.text += self.text_stream.close()

    def new_text(self) -> str:
        """Text not yet taken that can be sent."""
        end = len(self.text) if self.finish else max(self.sent_text, len(self.text) - self.hold)
        text, self.sent_text = self.text[self.sent_text:end], end
        return text

    def scored_tokens(self) -> list[int]:
        """The tokens its text came from: a stop token that ended it is not part of the text."""
        stopped = self.finish == "stop" and self.tokens and self.tokens[-1] in self.stop_tokens
        return self.tokens[:-1] if stopped else self.tokens

    def new_tokens(self) -> list[int]:
        tokens, self.sent_tokens = self.tokens[self.sent_tokens:], len(self.tokens)
        return tokens
