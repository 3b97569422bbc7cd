"""What one HTTP process of `serve` costs per token it relays: the real app (serve.app's service under
uvicorn, its EngineClient on a real channel, prometheus-client in multiprocess mode as with several
HTTP processes) in a process of its own, fed by a stand-in engine that sends one message per step for
all its running jobs (as the engine's Outbox does) at a fixed pace, and read by `loadtest`'s streaming
clients. The figure: the HTTP process's CPU time (user + system, from /proc) per token delivered, so a
machine that cannot run all three at full speed still compares two builds. From the repository root:
`python docs/journal/probes/serve_http_cost/http_cost_probe.py TREE [CLIENTS] [SECONDS] [PACE_MS]`
(TREE: the checkout whose serve/ is measured; the clients always come from this one's pipeline/;
SPY=path: a py-spy profile of the HTTP process, raw format)."""
import asyncio
import multiprocessing
import os
import random
import sys
import tempfile
import time

TOKENS, PORT, TOKEN_ID = 128, 8125, 262  # 262: " the"


def stand_in_engine(commands, results, pace):
    """Jobs as submitted; every `pace` seconds one message with each running job's next token."""
    jobs, due = {}, time.perf_counter()
    while True:
        if commands.poll(max(0.0, due - time.perf_counter())):
            try:
                message = commands.recv()
            except EOFError:
                return
            if message[0] == "submit":
                jobs[message[1]] = [TOKENS, len(message[2]), True]
            elif message[0] == "cancel":
                jobs.pop(message[1], None)
            continue
        due += pace
        out = []
        for job_id, job in list(jobs.items()):
            if job[2]:
                out.append((job_id, "started"))
                job[2] = False
            out.append((job_id, [TOKEN_ID] * job[1]))
            job[0] -= 1
            if job[0] == 0:
                out.append((job_id, None))
                del jobs[job_id]
        if out:
            results.send(out)


def http_process(tree, channel, waiting, checkpoint):
    sys.path.insert(0, tree)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp()
    from pipeline.config import ServeConfig
    from pipeline.tokenizer import load_tokenizer
    from serve.app import create_service
    from serve.server import listen, run_http
    assert create_service.__code__.co_filename.startswith(tree), create_service.__code__.co_filename

    settings = ServeConfig(port=PORT, queue=1024)
    info = {"backend": "stand-in", "precision": "fp16", "device": "cpu", "context": 1024, "scheduler": "continuous"}
    service = create_service(channel, info, waiting, load_tokenizer(checkpoint), settings, "m")
    run_http(service, settings, listen(settings))


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    from serve import loadtest as lt

    tree = os.path.abspath(sys.argv[1])
    clients = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 10.0
    pace = float(sys.argv[4]) / 1e3 if len(sys.argv) > 4 else 0.6e-3
    context = multiprocessing.get_context("spawn")
    commands_in, commands_out = context.Pipe(duplex=False)
    results_in, results_out = context.Pipe(duplex=False)
    engine = context.Process(target=stand_in_engine, args=(commands_in, results_out, pace), daemon=True)
    waiting = context.Value("q", 0)  # held here until the child has it
    http = context.Process(target=http_process, args=(tree, (commands_out, results_in), waiting,
                                                      "artifacts/timing/checkpoint"), daemon=True)
    engine.start()
    http.start()
    settings = lt.LoadSettings(url=f"http://127.0.0.1:{PORT}", max_tokens=TOKENS)
    for _ in range(600):
        try:
            lt.server_info(settings.url)
            break
        except Exception:
            time.sleep(0.1)
    prompts = ["The quick brown fox jumps over the lazy dog. " * 12]
    asyncio.run(lt.closed_loop(settings, "m", clients, prompts, time.perf_counter() + 3.0, random.Random(0)))  # warm
    if os.environ.get("SPY"):  # a py-spy profile of the HTTP process over the measured window
        import subprocess
        subprocess.Popen(["py-spy", "record", "-p", str(http.pid), "-d", str(int(seconds) - 1), "-r", "250",
                          "--nonblocking", "--gil", "--format", "raw", "-o", os.environ["SPY"]], stdout=subprocess.DEVNULL)
    cpu, wall = cpu_seconds(http.pid), time.perf_counter()
    run = asyncio.run(lt.closed_loop(settings, "m", clients, prompts, time.perf_counter() + seconds, random.Random(1)))
    cpu, wall = cpu_seconds(http.pid) - cpu, time.perf_counter() - wall
    tokens, chunks = len(run.arrivals), sum(len(s.itls) + 1 for s in run.samples)
    print(f"{tree}: {clients} clients, pace {pace * 1e3:g} ms: {tokens / wall:,.0f} tokens/s in {chunks / wall:,.0f} "
          f"chunks/s; HTTP process {cpu / wall:.0%} of a core, {cpu / tokens * 1e6:.1f} us a token, "
          f"{cpu / chunks * 1e6:.1f} us a chunk; errors {run.errors}", flush=True)
    http.kill()
    engine.kill()
