"""Host cost of handing one 64-row step's deliveries to pipeline.engine_process.Outbox (64 puts, then the
scheduler's flush) while its sender thread pickles and sends them down a pipe: the engine
process's scheduler thread pays it every step. From the repository root on any machine:
`python docs/journal/probes/serve_cpu_host/outbox_probe.py`."""
import multiprocessing
import threading
import time

from pipeline.engine_process.child import Outbox

STEPS, ROWS = 2000, 64
reader, writer = multiprocessing.Pipe(duplex=False)


def drain():
    try:
        while True:
            reader.recv()
    except EOFError:
        pass


threading.Thread(target=drain, daemon=True).start()
box = Outbox([writer])
threading.Thread(target=box.run, daemon=True).start()
start = time.perf_counter()
for _ in range(STEPS):
    for job in range(ROWS):
        box.put((0, job), [123])
    box.flush()
print(f"{ROWS} deliveries and a flush, back to back: {(time.perf_counter() - start) / STEPS * 1e6:.0f} us a step")
