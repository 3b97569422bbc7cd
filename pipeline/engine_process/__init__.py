"""The engine in a process of its own: the backend and its scheduler run in a child process
(child.py), the HTTP side in one or more others (parent.py; serve.server and the Triton model run it), so the scheduler never
waits for the GIL while an event loop writes streams (docs/journal/performance.md, "Serving"). The
pipes between them carry the named messages of messages.py."""
