"""The continuous scheduler alone at 1/8/64 closed-loop clients (no HTTP): tokens/s and where the host's
time per launch goes (each scheduler method timed, inclusive, per launch). GPT-2 124M shape, random
weights, triton fp16, prompts of 128 tokens, 128 new tokens, greedy. From the repository root on a GPU:
`RTT_MS=5 MODE=outbox PYTHONPATH=. python artifacts/results/serve_h200_greedy_chunks/engine_probe.py`
(RTT_MS: each client's turnaround between requests, uniform in 0.5-1.5x; MODE=outbox: deliveries
through the engine's Outbox (as the code under PYTHONPATH has it: a sender thread before this change,
the scheduler's own sends after) to four processes that drain the pipes, with the engine's GIL switch
interval; MODE=plain: a no-op delivery; CHUNK=n: GREEDY_CHUNK; JOIN=n: JOIN_EVERY; LEVELS=1,64: the client counts;
SPY=path: a py-spy record of the 64-client level; WIDE_POSITIONS=n: the scheduler's cache 2n columns wide
(GPU_TIMES); FIRST=uniform: every row's first slot 200 before the step's, the offline cache's span (GPU_TIMES); each level also prints the time to first token p50 / p90
from a job's submission to its first delivery; GPU_TIMES=1: decode GPU times in the wide cache (rows of
spread ages where the scheduler keeps each row's first slot) and in an offline one). The drain processes re-import this module (spawn) and can take longer
than the warm-up to start reading: with the scheduler sending itself, its first level (1 client)
then waits on full pipes, so that level's figure is the probe's, not the scheduler's."""
import collections, multiprocessing, os, sys, threading, time
import torch
from transformers import GPT2Config, GPT2LMHeadModel
from pipeline.runtime.static.triton_backend import TritonBackend
from pipeline.runtime import scheduler as S
from pipeline.runtime.sampling import Sampling

MODE = os.environ.get("MODE", "plain")  # plain: no-op deliver; outbox: the engine's Outbox over pipes to a drain process


def drain(conn):
    try:
        while True:
            conn.recv()
    except EOFError:
        pass


def main():
    sys.setswitchinterval(2e-4)  # as the engine process sets it (serve.engine.SWITCH_INTERVAL_S)
    torch.manual_seed(0)
    be = TritonBackend(GPT2LMHeadModel(GPT2Config()).eval(), "fp16", "cuda")
    flush = S.no_flush
    if MODE in ("outbox", "inline"):
        from serve.engine import Outbox
        ctx = multiprocessing.get_context("spawn")
        ends = [ctx.Pipe(duplex=False) for _ in range(4)]
        for r, _ in ends:
            ctx.Process(target=drain, args=(r,), daemon=True).start()
        outbox = Outbox([w for _, w in ends])
        if hasattr(outbox, "run"):  # an Outbox with a sender thread of its own (before inline sends)
            threading.Thread(target=outbox.run, daemon=True).start()
        flush = outbox.flush
    if os.environ.get("CHUNK"):
        S.GREEDY_CHUNK = int(os.environ["CHUNK"])
    if os.environ.get("JOIN"):
        S.JOIN_EVERY = int(os.environ["JOIN"])
    if os.environ.get("WIDE_POSITIONS"):  # the scheduler's cache is 2 x n_positions columns wide
        be.n_positions = int(os.environ["WIDE_POSITIONS"])
    t = time.perf_counter()
    sch = S.make_scheduler(be, 0, 64, True, flush)
    print(f"warm_up {time.perf_counter() - t:.1f}s", flush=True)
    if os.environ.get("GPU_TIMES"):
        def gpu_ms(fn, n=50):
            fn(); torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(n): fn()
            b.record(); torch.cuda.synchronize(); return a.elapsed_time(b) / n
        with torch.inference_mode():
            sch.batch.slot_mask[:, :300] = True
            for rows in (1, 8, 64):
                sch.column = 256
                tok = torch.zeros(rows, 1, dtype=torch.long, device="cuda"); pos = torch.full((rows, 1), 200, dtype=torch.long, device="cuda")
                if hasattr(sch, "first_in"):  # rows of spread ages, as in steady serving: 128-256 filled slots each
                    sch.first_in[:rows] = torch.linspace(128, 0, rows, device="cuda").long()
                    if os.environ.get("FIRST") == "uniform":  # every row 200 slots, as the offline cache reads
                        sch.first_in[:rows] = 56
                sch.tokens_in[:rows], sch.positions_in[:rows] = 0, 200
                wide = gpu_ms(lambda: sch.decode(rows))
                chunk = gpu_ms(lambda: collections.deque(sch.greedy_chunk(rows, 8), 0), 10) / 8
                be.reset(rows, 256); be.slot.slot_mask[:] = True
                narrow = gpu_ms(lambda: be.replay_decode(tok, pos, 200))
                print(f"GPU ms/step rows {rows}: wide decode {wide:.3f}, wide greedy chunk {chunk:.3f}, offline-cache decode {narrow:.3f}", flush=True)
            sch.batch.slot_mask.zero_(); sch.column = 0; sch.positions_in.zero_()
    timers = collections.Counter()
    calls = collections.Counter()

    def wrap(obj, name):
        f = getattr(obj, name)
        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                timers[name] += time.perf_counter() - t0
                calls[name] += 1
        setattr(obj, name, timed)

    for n in ("retire", "launch", "read", "admit", "join", "leave", "shift", "pick", "take", "decode", "greedy_chunk", "prefill", "settle"):
        wrap(sch, n)
    wrap(be, "replay_decode")
    tokens = [0]
    ttfts = []  # seconds from a job's submission to its first delivered tokens
    import heapq, random
    rtt = float(os.environ.get("RTT_MS", "0")) / 1e3  # a client's turnaround between requests
    due, due_lock, rnd = [], threading.Lock(), random.Random(0)

    def later(delay, k):
        with due_lock:
            heapq.heappush(due, (time.perf_counter() + delay, k))

    def submitter():
        while True:
            with due_lock:
                ready = due and due[0][0] <= time.perf_counter()
                item = heapq.heappop(due) if ready else None
            if item is None:
                time.sleep(0.0002)
            else:
                sch.submit(new_job(item[1]))
    threading.Thread(target=submitter, daemon=True).start()
    prompt = [(i * 7) % 50000 for i in range(128)]
    stop = [False]

    def new_job(k):
        submitted, first = time.perf_counter(), [True]

        def deliver(item):
            if isinstance(item, list):
                tokens[0] += 1
                if first[0]:
                    first[0] = False
                    ttfts.append(time.perf_counter() - submitted)
            elif item is None and not stop[0]:
                later(rtt * rnd.uniform(0.5, 1.5), k)
            elif isinstance(item, Exception):
                print("error", item, flush=True)
        job = S.Job([prompt], Sampling(max_new_tokens=128), deliver)
        if MODE in ("outbox", "inline"):
            key = (k % 4, k)
            job.deliver = outbox.deliverer(key, {})
            inner = job.deliver
            def deliver2(item, inner=inner):
                inner(item)
                deliver(item)
            job.deliver = deliver2
        return job

    sch.start()
    for clients in [int(n) for n in os.environ.get("LEVELS", "1,8,64").split(",") if n]:
        stop[0] = False
        for k in range(clients):
            later(rnd.uniform(0, 0.1), k)  # staggered starts, as HTTP clients are
        time.sleep(3)
        timers.clear(); calls.clear(); ttfts.clear()
        spy = None
        if clients == 64 and os.environ.get("SPY"):
            import subprocess
            spy = subprocess.Popen(["/tmp/site/bin/py-spy", "record", "--nonblocking", "-r", "250", "-d", "5", "-f", "raw",
                                    "-o", os.environ["SPY"], "--pid", str(os.getpid())], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t0, n0 = time.perf_counter(), tokens[0]
        time.sleep(6)
        dt, dn = time.perf_counter() - t0, tokens[0] - n0
        stop[0] = True
        if spy is not None:
            spy.wait()
        steps = calls["launch"]
        print(f"[{MODE} rtt {rtt*1e3:.0f}ms] clients {clients}: {dn / dt:,.0f} tok/s, {steps / dt:,.0f} launches/s, "
              f"{dt / max(steps, 1) * 1e3:.3f} ms/launch, joins {calls['join']}, leaves {calls['leave']}", flush=True)
        q = sorted(ttfts) or [0.0]
        print(f"   TTFT ms p50 {q[len(q) // 2] * 1e3:.2f} p90 {q[len(q) * 9 // 10] * 1e3:.2f} ({len(q)} jobs)", flush=True)
        print("   per launch (us): " + ", ".join(f"{n} {timers[n] / max(steps, 1) * 1e6:.0f}({calls[n]})" for n in sorted(timers, key=lambda n: -timers[n])), flush=True)
        time.sleep(2)  # let the jobs finish
    os._exit(0)


if __name__ == "__main__":
    main()
