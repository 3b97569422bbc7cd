#!/bin/bash
# A copy of tree $1 in $2 with a timestamp (tr.py) at each hop of a request, from the HTTP app to the
# scheduler and back; a pattern a tree lacks (older or newer code) is reported and skipped.
D=${2:-/tmp/trace}
mkdir -p $D /tmp/trlog; rm -rf $D/pipeline $D/serve; cp -r $1/pipeline $1/serve $D/; cp "$(dirname "$0")/tr.py" $D/
cd $D && python3 - <<'PY'
def patch(path, pairs):
    s = open(path).read()
    for old, new in pairs:
        if old not in s:
            print("trace: not found in", path, ":", old.strip()[:60]); continue
        s = s.replace(old, new, 1)
    open(path, "w").write(s)
patch("serve/middleware.py", [('''    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":''', '''    async def __call__(self, scope, receive, send):
        import tr; tr.t("g0 asgi")
        if scope["type"] != "http":''')])
patch("serve/openai_api.py", [
 ('''        if req.model != model_name:''', '''        import tr; tr.t("h0 handler")
        if req.model != model_name:'''),
 ('''        completion = hub.start(ids, sampling, stops)''', '''        tr.t("h1 encoded")
        completion = hub.start(ids, sampling, stops)
        tr.t("h2 submitted")'''),
 ('''                    chunk = self.chunk(choices, options.continuous_usage_stats)''', '''                    import tr; tr.t("h5 chunk")
                    chunk = self.chunk(choices, options.continuous_usage_stats)'''),
 ('''                if choices:
                    yield self.chunk(''', '''                if choices:
                    import tr; tr.t("h5 chunk")
                    yield self.chunk('''),
])
patch("serve/engine.py", [
 ('''                for job_id, item in self.results.recv():''', '''                got = self.results.recv()
                import tr; tr.t("h3 reader got")
                for job_id, item in got:'''),
 ('''            if message[0] == "submit":''', '''            if message[0] == "submit":
                import tr; tr.t("e0 engine recv")'''),
 ('''        if message[0] == "submit":
            _, _, prompts, sampling = message''', '''        if message[0] == "submit":
            import tr; tr.t("e0 engine recv")
            _, _, prompts, sampling = message'''),
 ('''                self.results[channel].send(items)''', '''                self.results[channel].send(items)
                import tr; tr.t("e4 sent")'''),
])
patch("serve/streaming.py", [
 ('''    def flush(self) -> None:
        with self.lock:''', '''    def flush(self) -> None:
        import tr; tr.t("h4 loop relay")
        with self.lock:'''),
])
patch("pipeline/runtime/scheduler.py", [
 ('''            self.deferred.append(self.waiting.get())''', '''            self.deferred.append(self.waiting.get())
            import tr; tr.t("e1 sched got")'''),
 ('''        self.deferred += self.inbox.take(wait and not self.deferred)''', '''        self.deferred += self.inbox.take(wait and not self.deferred)
        import tr; tr.t("e1 sched got")'''),
 ('''        prompts = [(job, k, p) for job in jobs for k, p in enumerate(job.prompts)]''', '''        import tr; tr.t("e1x join in")
        prompts = [(job, k, p) for job in jobs for k, p in enumerate(job.prompts)]'''),
 ('''        batch = left_pad(prompts + prompts[:1] * (bucket - joined), self.pad_id, self.backend.device, width)''', '''        import tr; tr.t("e1a prefill in")
        batch = left_pad(prompts + prompts[:1] * (bucket - joined), self.pad_id, self.backend.device, width)
        tr.t("e1b padded")'''),
 ('''            logits, mask, prefilled = self.prefill([p for _, _, p in chunk], width)''', '''            logits, mask, prefilled = self.prefill([p for _, _, p in chunk], width)
            import tr; tr.t("e1c prefill launched")'''),
 ('''            logits, prefilled = self.prefill([p for _, _, p in chunk], width)''', '''            logits, prefilled = self.prefill([p for _, _, p in chunk], width)
            import tr; tr.t("e1c prefill launched")'''),
 ('''            marks = self.batch.slot_mask''', '''            tr.t("e1d rows copied")
            marks = self.batch.slot_mask'''),
 ('''            picked.append(self.pick(rows, logits))''', '''            tr.t("e1e marks rows")
            picked.append(self.pick(rows, logits))'''),
 ('''        tokens = torch.cat(picked)''', '''        tr.t("e1f picked")
        tokens = torch.cat(picked)'''),
 ('''        self.unread.append(Readback(joined, tokens, self.host_buffers))''', '''        tr.t("e1g inputs set")
        self.unread.append(Readback(joined, tokens, self.host_buffers))
        tr.t("e1h joined")'''),
 ('''        launched = self.launch() if self.placed else []''', '''        launched = self.launch() if self.placed else []
        import tr; tr.t("e2 launched")'''),
 ('''    def take(self, readback: Readback) -> None:
        """''', '''    def take(self, readback: Readback) -> None:
        import tr; tr.t("e3 take")
        """'''),
])
patch("pipeline/runtime/static/static_backend.py", [
 ('''        entry.graph.replay()''', '''        import tr; tr.t("e1b2 staged"); tr.ev("p0")
        entry.graph.replay()
        tr.ev("p1")'''),
])
# CUDA events of one join (tr.ev, read by angpu.py): the prefill's start and end, the join's end, the first chunk's launch
patch("pipeline/runtime/scheduler.py", [
 ('''        launched = self.launch() if self.placed else []
        import tr; tr.t("e2 launched")''', '''        import tr; tr.ev("g0")
        launched = self.launch() if self.placed else []
        import tr; tr.t("e2 launched"); tr.ev("g1")'''),
 ('''    def take(self, readback: Readback) -> None:
        import tr; tr.t("e3 take")''', '''    def take(self, readback: Readback) -> None:
        import tr; tr.t("e3 take"); tr.evflush()'''),
 ('''        tr.t("e1h joined")''', '''        tr.t("e1h joined"); tr.ev("j1")'''),
])
PY
