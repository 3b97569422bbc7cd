"""Reading a step's tokens back to the host without making the device wait: each step's picked tokens
are copied to reused page-locked buffers on a stream of their own and read after later steps are
launched (the serving scheduler's pipelining, pipeline.runtime.scheduler)."""

from __future__ import annotations

import torch


class HostBuffers:
    """Page-locked buffers of `size` token ids, each with two events, reused by the Readbacks, and the
    stream their copies run on: allocating per step costs the scheduler host time, and a copy on the
    compute stream holds up every step (docs/journal/performance.md)."""

    def __init__(self, size: int, device: torch.device):
        self.size, self.spare = size, []
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def take(self) -> tuple[torch.Tensor, torch.cuda.Event, torch.cuda.Event]:
        """(buffer, an event for the picked tokens, one for their copy)"""
        return self.spare.pop() if self.spare else (torch.empty(self.size, dtype=torch.long, pin_memory=True),
                                                    torch.cuda.Event(), torch.cuda.Event())

    def give(self, buffer: tuple[torch.Tensor, torch.cuda.Event, torch.cuda.Event]) -> None:
        self.spare.append(buffer)


class Readback:
    """One step's tokens picked on the device, copied to page-locked host memory on a stream of their own
    without waiting: the host reads them (tolist) after it has launched the next steps, so the device
    never waits for the host, nor the next step for the copy. What the copy reads is not rewritten before
    it has run: the tokens are held until read (the allocator's memory), and greedy chunks take two sets
    of columns in turn, a chunk launched only once the one two before it has been read (greedy_chunk)."""

    def __init__(self, rows: list, tokens: torch.Tensor, buffers: HostBuffers):
        self.rows = rows  # the rows as they were placed when the tokens were picked (None: free): tokens [len(rows)]
        self.buffers, self.buffer, self.tokens = buffers, None, None
        if tokens.device.type == "cuda":
            self.buffer = pinned, picked, copied = buffers.take()
            self.host, self.tokens = pinned[:len(tokens)], tokens
            picked.record()
            buffers.stream.wait_event(picked)
            with torch.cuda.stream(buffers.stream):
                self.host.copy_(tokens, non_blocking=True)
                copied.record()
        else:  # the next step may rewrite what `tokens` views (a greedy chunk's buffer)
            self.host = tokens.clone()

    def tolist(self) -> list[int]:
        if self.buffer is None:
            return self.host.tolist()
        self.buffer[2].synchronize()
        tokens = self.host.tolist()
        self.buffers.give(self.buffer)  # read: the next step's copy may overwrite it
        self.tokens = None
        return tokens
