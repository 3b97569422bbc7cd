"""The schedulers that serve runs: continuous batching returns, for every job, the tokens the job
gets alone, whatever else is in the batch and whenever it arrives."""

import random
import threading
import time

import pytest
import torch

from pipeline.runtime import admission, rows
from pipeline.runtime import scheduler as scheduling
from pipeline.runtime.generate import Generator
from pipeline.runtime.sampling import Sampling
from pipeline.runtime.scheduler import (
    ContinuousScheduler,
    Job,
)
from pipeline.runtime.static.torch_compiled import TorchCompiledBackend


class Collected:
    """A job's delivered steps, one list of tokens per step, and its end."""

    def __init__(self):
        self.steps, self.error, self.done = [], None, threading.Event()

    def __call__(self, item):
        if item is None or isinstance(item, Exception):
            self.error = item
            self.done.set()
        else:
            self.steps.append(list(item))

    def rows(self, stop_tokens) -> list[list[int]]:
        """Each prompt's tokens up to and including its first stop token, as Generator.generate cuts them."""
        out = []
        for row in zip(*self.steps):
            cut = next((i + 1 for i, t in enumerate(row) if t in stop_tokens), len(row))
            out.append(list(row[:cut]))
        return out


def mixed_jobs(seed: int, count: int) -> list[tuple[list[list[int]], Sampling]]:
    """Greedy, seeded sampling and repetition-penalty jobs of different lengths, some of several prompts."""
    rng = random.Random(seed)
    jobs = []
    for i in range(count):
        prompts = [[rng.randrange(50000) for _ in range(rng.randint(1, 12))] for _ in range(1 + (i % 5 == 2))]
        sampling = Sampling(max_new_tokens=rng.randint(1, 24), do_sample=i % 3 == 0, temperature=0.8, top_k=50,
                            seed=i, repetition_penalty=1.3 if i % 4 == 1 else 1.0, stop_tokens=(50256,))
        jobs.append((prompts, sampling))
    return jobs


def alone(model, prompts, sampling, backend=None):
    """What the job's prompts get one at a time, through the offline generator (on `backend`, or a CPU one)."""
    backend = backend or TorchCompiledBackend(model, "fp32", "cpu", compile=False)
    return [Generator(backend, 0).generate([p], sampling)[0] for p in prompts]


def serve_jobs(scheduler, jobs, rng: random.Random) -> list[Collected]:
    results = []
    for prompts, sampling in jobs:
        results.append(Collected())
        scheduler.submit(Job(prompts, sampling, results[-1]))
        time.sleep(rng.random() * 0.02)  # arrivals at different steps
    assert all(r.done.wait(60) for r in results)
    return results


class OneBufferBackend(TorchCompiledBackend):
    """Every layer's cache in one buffer, as the triton backend keeps it: joins, shifts and compacts copy
    all layers at once."""
    cache_in_one_buffer = True


@pytest.mark.parametrize("overlap", [True, False], ids=["pipelined", "read-first"])
@pytest.mark.parametrize("shift,backend", [(64, TorchCompiledBackend), (2, TorchCompiledBackend), (2, OneBufferBackend)],
                         ids=["few-shifts", "shift-every-other-step", "shift-every-other-step-one-buffer"])
def test_every_job_gets_the_tokens_it_gets_alone(model, monkeypatch, shift, backend, overlap):
    """Four rows for twelve jobs: jobs wait, join mid-run into freed rows, leave at their stop
    token or length; with a small SHIFT_COLUMNS the rows also move left while they run (with the
    layers' caches apart, and in one buffer). Pipelined (a GPU's way: a step's tokens read while the
    next runs, stops seen a step late) and read first (a CPU's)."""
    monkeypatch.setattr(rows, "SHIFT_COLUMNS", shift)
    scheduler = ContinuousScheduler(backend(model, "fp32", "cpu", compile=False), pad_id=0, max_rows=4)
    assert (scheduler.table.batch.layers is not None) == backend.cache_in_one_buffer
    scheduler.overlap = overlap
    moves, shift_rows = [], scheduler.table.shift

    def counted(force):
        before = scheduler.table.column
        shift_rows(force)
        moves.append(bool(scheduler.rows) and scheduler.table.column < before)

    scheduler.table.shift = counted
    scheduler.warm_up()
    scheduler.start()
    jobs = mixed_jobs(0, 12)
    results = serve_jobs(scheduler, jobs, random.Random(1))
    for (prompts, sampling), result in zip(jobs, results):
        assert result.error is None
        want = alone(model, prompts, sampling) if len(prompts) == 1 or not sampling.do_sample else None
        if want is not None:
            assert result.rows(sampling.stop_tokens) == want, (prompts, sampling)
    assert not scheduler.rows and not scheduler.running and scheduler.table.column == 0
    assert shift == 64 or sum(moves) >= 3  # the rows did move while running


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: the pipelined steps' host copies run there")
def test_on_a_gpu_every_job_gets_the_tokens_it_gets_alone(model):
    """The GPU's way: graphs, greedy chunks, each step's tokens copied to reused page-locked buffers and
    read while later steps run; greedy jobs, so that every step of the chunks is compared."""
    scheduler = ContinuousScheduler(TorchCompiledBackend(model, "fp32", "cuda", compile=False), pad_id=0, max_rows=4)
    scheduler.warm_up()
    scheduler.start()
    jobs = [(prompts, Sampling(max_new_tokens=sampling.max_new_tokens, stop_tokens=sampling.stop_tokens))
            for prompts, sampling in mixed_jobs(2, 12)]
    results = serve_jobs(scheduler, jobs, random.Random(3))
    # one backend for every job alone: backends dropped one after another were collected during a later
    # capture, and a graph destroyed while another is captured aborts the process
    offline = TorchCompiledBackend(model, "fp32", "cuda", compile=False)
    for (prompts, sampling), result in zip(jobs, results):
        assert result.error is None and result.rows(sampling.stop_tokens) == alone(model, prompts, sampling, offline)
    assert len(scheduler.host_buffers.spare) >= 2  # the copies' buffers came back to be reused


@pytest.mark.parametrize("overlap", [True, False], ids=["pipelined", "read-first"])
def test_a_stop_token_ends_its_row_and_the_row_is_reused(model, overlap):
    backend = TorchCompiledBackend(model, "fp32", "cpu", compile=False)
    free = alone(model, [[464, 2068, 7586]], Sampling(max_new_tokens=12))[0]
    stop = Sampling(max_new_tokens=12, stop_tokens=(free[3],))
    scheduler = ContinuousScheduler(backend, pad_id=0, max_rows=1)
    scheduler.overlap = overlap
    scheduler.start()
    results = serve_jobs(scheduler, [([[464, 2068, 7586]], stop), ([[818, 262]], Sampling(max_new_tokens=5))],
                         random.Random(0))
    assert results[0].rows(stop.stop_tokens) == [free[:free.index(free[3]) + 1]]
    assert results[1].rows(()) == alone(model, [[818, 262]], Sampling(max_new_tokens=5))


def test_a_cancelled_job_leaves_the_batch_at_the_next_step(model):
    scheduler = ContinuousScheduler(TorchCompiledBackend(model, "fp32", "cpu", compile=False), pad_id=0, max_rows=1)
    scheduler.start()
    long, short = Collected(), Collected()
    job = Job([[464, 2068]], Sampling(max_new_tokens=60), long)
    scheduler.submit(job)
    while not long.steps:
        time.sleep(0.001)
    job.cancelled.set()
    scheduler.submit(Job([[818, 262]], Sampling(max_new_tokens=3), short))
    assert short.done.wait(30) and long.done.wait(30)
    assert len(long.steps) < 60 and short.rows(()) == alone(model, [[818, 262]], Sampling(max_new_tokens=3))


def test_an_ended_prompt_leaves_while_the_jobs_other_prompt_runs_on(model):
    """A consumer that needs no more of one prompt (a stop string) ends it: its row leaves at the next
    step, the other prompt of the job runs to its length with the tokens it gets alone."""
    scheduler = ContinuousScheduler(TorchCompiledBackend(model, "fp32", "cpu", compile=False), pad_id=0, max_rows=2)
    scheduler.start()
    collected = Collected()
    job = Job([[464, 2068], [818, 262]], Sampling(max_new_tokens=40), collected)
    scheduler.submit(job)
    while not collected.steps:
        time.sleep(0.001)
    job.end(0)
    assert collected.done.wait(60) and collected.error is None
    first, second = collected.rows(())
    assert second == alone(model, [[818, 262]], Sampling(max_new_tokens=40))[0]
    assert first[-1] == 0 and first.index(0) < 10  # pad from the step after it ended
    job.end(1)
    assert job.cancelled.is_set()  # every prompt ended: the whole job is


def test_jobs_taken_from_the_queue_to_wait_for_rows_start_only_as_they_run_or_are_cancelled(model):
    """Driven step by step (no thread): one row runs a job, two jobs wait in the scheduler's own
    list; they are started (what the engine's waiting-queue cap counts on) once cancelled there."""
    scheduler = ContinuousScheduler(TorchCompiledBackend(model, "fp32", "cpu", compile=False), pad_id=0, max_rows=1)
    started = []
    running = Job([[464]], Sampling(max_new_tokens=50), Collected(), on_start=lambda: started.append("running"))
    scheduler.submit(running)
    scheduler.admit(wait=False)
    waiting = [Job([[818]], Sampling(max_new_tokens=1), Collected(), on_start=lambda: started.append("waiting"))
               for _ in range(2)]
    for job in waiting:
        scheduler.submit(job)
    scheduler.admit(wait=False)
    assert scheduler.inbox.queue.empty() and len(scheduler.admission.waiting) == 2 and started == ["running"]
    for job in waiting:
        job.cancelled.set()
    scheduler.admit(wait=False)
    assert not scheduler.admission.waiting and started == ["running", "waiting", "waiting"]
    # and they end, so a consumer that counts its jobs (the HTTP side's running gauge) counts them done
    assert all(job.deliver.done.is_set() and job.deliver.error is None and not job.deliver.steps for job in waiting)


def test_jobs_arriving_while_rows_run_gather_and_join_in_one_prefill(model, monkeypatch):
    """Driven step by step (no thread): with a row running, two jobs wait JOIN_EVERY steps and then
    join in one prefill; JOIN_ROWS waiting prompts join at once; with nothing running a job joins
    at once."""
    scheduler = ContinuousScheduler(TorchCompiledBackend(model, "fp32", "cpu", compile=False), pad_id=0, max_rows=32)
    prefills, run_prefill = [], scheduler.prefills.run
    monkeypatch.setattr(scheduler.prefills, "run",
                        lambda prompts, width: prefills.append(len(prompts)) or run_prefill(prompts, width))
    scheduler.submit(Job([[464]], Sampling(max_new_tokens=100), Collected()))
    scheduler.admit(wait=False)
    assert len(scheduler.rows) == 1 and prefills == [1]
    for _ in range(2):
        scheduler.submit(Job([[818, 262]], Sampling(max_new_tokens=5), Collected()))
    while scheduler.admission.held < admission.JOIN_EVERY:  # steps launched while they gather (greedy chunks)
        scheduler.admit(wait=False)
        assert len(scheduler.rows) == 1 and len(scheduler.admission.waiting) == 2
        scheduler.step()
    assert scheduler.admission.held == admission.JOIN_EVERY  # a chunk ends where they are due
    scheduler.admit(wait=False)
    assert len(scheduler.rows) == 3 and prefills == [1, 2] and not scheduler.admission.waiting
    scheduler.submit(Job([[818]] * admission.JOIN_ROWS, Sampling(max_new_tokens=5), Collected()))
    scheduler.admit(wait=False)
    assert len(scheduler.rows) == 3 + admission.JOIN_ROWS and prefills == [1, 2, admission.JOIN_ROWS]


@pytest.mark.parametrize("overlap", [True, False], ids=["pipelined", "read-first"])
def test_greedy_rows_with_nobody_waiting_run_chunks_on_the_device(model, monkeypatch, overlap):
    """All rows plain greedy and the queue empty: GREEDY_CHUNK steps at a time through the backend's
    greedy graph; a stop token inside a chunk still ends the row there."""
    chunks = []
    scheduler = ContinuousScheduler(TorchCompiledBackend(model, "fp32", "cpu", compile=False), pad_id=0, max_rows=4)
    scheduler.overlap = overlap
    run_chunk = scheduler.backend.steps_in_place

    def counted(count, column, sampled):
        chunks.append((count, sampled))
        return run_chunk(count, column, sampled)

    monkeypatch.setattr(scheduler.backend, "steps_in_place", counted)
    scheduler.start()
    prompt = [464, 2068, 7586]
    free = alone(model, [prompt], Sampling(max_new_tokens=21))[0]
    stop = Sampling(max_new_tokens=21, stop_tokens=(free[10],))
    results = serve_jobs(scheduler, [([prompt], Sampling(max_new_tokens=21)), ([prompt], stop)], random.Random(0))
    assert results[0].rows(()) == [free]
    assert results[1].rows(stop.stop_tokens) == [free[:free.index(free[10]) + 1]]
    assert chunks and max(chunks) == (scheduling.GREEDY_CHUNK, False)


def test_a_failing_prefill_ends_its_jobs_and_the_scheduler_goes_on(model, monkeypatch):
    backend = TorchCompiledBackend(model, "fp32", "cpu", compile=False)
    scheduler = ContinuousScheduler(backend, pad_id=0, max_rows=2)
    prefill, failing = backend.prefill, [True]

    def prefill_once_failing(batch, last_only=True):
        if failing.pop() if failing else False:
            raise RuntimeError("out of memory")
        return prefill(batch, last_only)

    monkeypatch.setattr(backend, "prefill", prefill_once_failing)
    scheduler.start()
    broken, fine = Collected(), Collected()
    scheduler.submit(Job([[464, 2068]], Sampling(max_new_tokens=3), broken))
    assert broken.done.wait(30) and isinstance(broken.error, RuntimeError)
    scheduler.submit(Job([[818, 262]], Sampling(max_new_tokens=3), fine))
    assert fine.done.wait(30) and fine.rows(()) == alone(model, [[818, 262]], Sampling(max_new_tokens=3))


def test_idle_rows_of_a_bucket_never_run_past_the_context(model):
    """A row that fills the whole context leaves first; three rows stay, so the 4-row bucket has an
    idle row, and greedy chunks advance every row of the bucket, the idle one too: its position must
    start from 0, not from the departed row's last one. Driven step by step (no thread)."""
    scheduler = ContinuousScheduler(TorchCompiledBackend(model, "fp32", "cpu", compile=False), pad_id=0, max_rows=4)
    context = model.config.n_positions
    jobs = [([[818]], Sampling(max_new_tokens=context - 1)) for _ in range(3)]
    jobs.append(([[464] * 40], Sampling(max_new_tokens=context - 40)))  # placed last, done first, at the context's end
    results = [Collected() for _ in jobs]
    for (prompts, sampling), result in zip(jobs, results):
        scheduler.submit(Job(prompts, sampling, result))
    scheduler.admit(wait=False)
    assert len(scheduler.rows) == 4
    while scheduler.rows or scheduler.unread:
        scheduler.step()
    assert all(r.done.is_set() and r.error is None for r in results)
    assert [r.rows(()) for r in results] == [alone(model, *job) for job in jobs]


@pytest.mark.parametrize("backend", [TorchCompiledBackend, OneBufferBackend], ids=["layers-apart", "one-buffer"])
def test_a_row_that_leaves_frees_its_cache_row_in_place_and_rows_move_only_to_fit_a_smaller_bucket(model, monkeypatch, backend):
    """Driven step by step (no thread, one step a launch), four rows of a 4-row bucket: the second
    leaves first and its cache row stays free in place (no row moves) until the next join fills it;
    once two rows are left, the last moves into the lowest free row so the 2-row bucket runs. Every
    job still gets the tokens it gets alone."""
    monkeypatch.setattr(scheduling, "GREEDY_CHUNK", 1)  # a chunk would end the second and third together
    scheduler = ContinuousScheduler(backend(model, "fp32", "cpu", compile=False), pad_id=0, max_rows=4)
    jobs = [([[818, 262]], Sampling(max_new_tokens=12)), ([[464]], Sampling(max_new_tokens=2)),
            ([[2068, 7586]], Sampling(max_new_tokens=4)), ([[262, 818, 11]], Sampling(max_new_tokens=20))]
    results = [Collected() for _ in jobs]
    for (prompts, sampling), result in zip(jobs, results):
        scheduler.submit(Job(prompts, sampling, result))
    scheduler.admit(wait=False)
    first, second, third, fourth = scheduler.table.placed
    while not second.left:
        scheduler.step()
    assert scheduler.table.placed == [first, None, third, fourth]
    late = ([[11, 464]], Sampling(max_new_tokens=3))
    results.append(Collected())
    scheduler.submit(Job(*late, results[-1]))
    scheduler.admission.held = admission.JOIN_EVERY  # joins at this step rather than gathering
    scheduler.admit(wait=False)
    placed = scheduler.table.placed
    assert placed[0] is first and placed[2:] == [third, fourth] and placed[1].job.prompts == late[0]
    while len(scheduler.rows) > 2:
        scheduler.step()
    assert scheduler.table.placed == [first, fourth] and fourth.index == 1
    while scheduler.rows or scheduler.unread:
        scheduler.step()
    assert [r.rows(()) for r in results] == [alone(model, *job) for job in [*jobs, late]]
