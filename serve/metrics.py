"""GET /metrics: the service in Prometheus' text format (prometheus-client), on a registry of its
own. Request outcomes, rejections, waiting and running requests, token counts and latency
histograms; GPU memory and utilisation through NVML (nvidia-ml-py) when the model runs on a GPU.
With several HTTP processes, prometheus-client's multiprocess mode (PROMETHEUS_MULTIPROC_DIR, set
before they start) sums every process's figures into each scrape."""

from __future__ import annotations

import glob
import logging
import os

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily

PREFIX = "gpt2deploy"
OUTCOMES = ("ok", "cancelled", "timeout", "invalid", "rejected", "error")
REJECTIONS = ("queue_full", "draining", "body_too_large", "body_timeout")
# seconds; decode steps take 0.1-10 ms, first tokens up to seconds under load
TOKEN_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
REQUEST_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
log = logging.getLogger(__name__)


class ServeMetrics:
    def __init__(self, gpu_index: int | None):
        self.registry = registry = CollectorRegistry()
        self.shared = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))  # several HTTP processes
        self.requests = Counter(f"{PREFIX}_requests", "Generation requests by outcome", ["outcome"], registry=registry)
        self.rejected = Counter(f"{PREFIX}_requests_rejected", "Requests refused before they ran, by reason",
                                ["reason"], registry=registry)
        for outcome in OUTCOMES:  # every series present from the start, at 0
            self.requests.labels(outcome)
        for reason in REJECTIONS:
            self.rejected.labels(reason)
        self.waiting = Gauge(f"{PREFIX}_requests_waiting", "Requests queued, not yet running", registry=registry,
                             multiprocess_mode="livesum")
        self.running = Gauge(f"{PREFIX}_requests_running", "Requests generating now", registry=registry,
                             multiprocess_mode="livesum")
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "Prompt tokens of the requests that ran", registry=registry)
        self.generated_tokens = Counter(f"{PREFIX}_generation_tokens", "Tokens generated", registry=registry)
        self.ttft = Histogram(f"{PREFIX}_time_to_first_token_seconds", "From a request's arrival to its first token",
                              buckets=TOKEN_BUCKETS, registry=registry)
        self.itl = Histogram(f"{PREFIX}_inter_token_latency_seconds",
                             "Between a request's successive tokens (tokens that reach the server together share the gap)",
                             buckets=TOKEN_BUCKETS, registry=registry)
        self.e2e = Histogram(f"{PREFIX}_request_duration_seconds", "From a request's arrival to its last token",
                             buckets=REQUEST_BUCKETS, registry=registry)
        self.gpu = GpuCollector.open(gpu_index) if gpu_index is not None else None
        if self.gpu is not None:
            registry.register(self.gpu)

    def load(self, waiting: int, running: int) -> None:
        self.waiting.set(waiting)
        self.running.set(running)

    def exposition(self) -> bytes:
        """The text a scrape gets: this process's figures, or every HTTP process's summed (a registry
        of its own per scrape, so concurrent scrapes share nothing)."""
        if not self.shared:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        registry.register(SharedFiles(os.environ["PROMETHEUS_MULTIPROC_DIR"]))
        if self.gpu is not None:
            registry.register(self.gpu)
        return generate_latest(registry)

    def reject(self, reason: str) -> None:
        self.rejected.labels(reason).inc()
        self.requests.labels("rejected").inc()


class SharedFiles:
    """prometheus-client's multiprocess collector over the files that have their header: a process that
    is starting creates each file empty before it writes one, and reading it then failed the scrape
    (a 500 while another HTTP process started)."""

    def __init__(self, folder: str):
        self.folder = folder

    def collect(self):
        files = [f for f in glob.glob(os.path.join(self.folder, "*.db")) if os.path.getsize(f) > 0]
        return multiprocess.MultiProcessCollector.merge(files, accumulate=True)


class GpuCollector:
    """GPU memory and utilisation read through NVML at each scrape."""

    def __init__(self, nvml, handle, index: int):
        self.nvml, self.handle, self.index = nvml, handle, str(index)

    @classmethod
    def open(cls, index: int) -> GpuCollector | None:
        try:
            import pynvml

            pynvml.nvmlInit()
            return cls(pynvml, pynvml.nvmlDeviceGetHandleByIndex(index), index)
        except Exception as e:  # no nvidia-ml-py, no driver: the service runs without GPU metrics
            log.warning("GPU metrics off: NVML is not available (%s)", e)
            return None

    def collect(self):
        memory = self.nvml.nvmlDeviceGetMemoryInfo(self.handle)
        rates = self.nvml.nvmlDeviceGetUtilizationRates(self.handle)
        for name, doc, value in (("gpu_memory_used_bytes", "GPU memory in use (all processes)", memory.used),
                                 ("gpu_memory_total_bytes", "GPU memory in all", memory.total),
                                 ("gpu_utilization_ratio", "Share of the last sample period the GPU was busy",
                                  rates.gpu / 100)):
            family = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=["gpu"])
            family.add_metric([self.index], value)
            yield family
