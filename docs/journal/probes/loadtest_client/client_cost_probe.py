"""The load generator's own CPU time per stream chunk: closed-loop streaming clients of one
`loadtest` module (its `closed_loop`) in this process, against a stand-in server in another process
that streams chunks shaped as `serve`'s /v1/completions chunks (continuous usage) at a fixed pace per
connection, so that the client alone is measured. From the repository root:
`python docs/journal/probes/loadtest_client/client_cost_probe.py serve/loadtest.py [CLIENTS] [SECONDS] [PACE_MS]`
(the first argument: the loadtest module to take the clients from, so an older copy compares)."""
import asyncio
import importlib.util
import json
import multiprocessing
import random
import sys
import time

TOKENS = 128


def chunk(i: int, finish) -> bytes:
    body = {"id": "cmpl-0123456789abcdef0123456789abcdef", "object": "text_completion", "created": 1796217255,
            "model": "m", "choices": [{"index": 0, "text": " word", "logprobs": None, "finish_reason": finish}],
            "usage": {"prompt_tokens": 128, "completion_tokens": i, "total_tokens": 128 + i}}
    event = b"data: " + json.dumps(body).encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(event), event)


async def handle(reader, writer, pace):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            for i in range(1, TOKENS + 1):
                writer.write(chunk(i, "length" if i == TOKENS else None))
                await writer.drain()
                await asyncio.sleep(pace)
            done = b"data: [DONE]\n\n"
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


def stand_in(port, pace):
    async def main():
        server = await asyncio.start_server(lambda r, w: handle(r, w, pace), "127.0.0.1", port)
        await server.serve_forever()
    asyncio.run(main())


if __name__ == "__main__":
    spec = importlib.util.spec_from_file_location("loadtest_under_test", sys.argv[1])
    lt = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = lt  # dataclasses look their module up
    spec.loader.exec_module(lt)
    clients = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 10.0
    pace = float(sys.argv[4]) / 1e3 if len(sys.argv) > 4 else 0.001
    server = multiprocessing.Process(target=stand_in, args=(8124, pace), daemon=True)
    server.start()
    time.sleep(1.0)
    settings = lt.LoadSettings(url="http://127.0.0.1:8124", max_tokens=TOKENS)
    asyncio.run(lt.closed_loop(settings, "m", clients, ["hello"], time.perf_counter() + 2.0, random.Random(0)))  # warm
    cpu, wall = time.process_time(), time.perf_counter()
    run = asyncio.run(lt.closed_loop(settings, "m", clients, ["hello"], time.perf_counter() + seconds, random.Random(1)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    chunks = sum(len(s.itls) + 1 for s in run.samples)
    print(f"{sys.argv[1]}: {clients} clients, pace {pace * 1e3:g} ms, {chunks / wall:,.0f} chunks/s, client CPU "
          f"{cpu / chunks * 1e6:.1f} us a chunk ({cpu / wall:.0%} of a core), errors {run.errors}", flush=True)
    server.kill()
