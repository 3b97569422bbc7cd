"""Back-to-back streaming requests to a traced server (mk.sh): TRACE=DIR PORT=N MAXT=new tokens N=requests
python client.py prompt.txt; each send, first chunk and end is stamped in /tmp/trlog."""
import asyncio
import os
import sys

import aiohttp

sys.path.insert(0, os.environ.get("TRACE", "/tmp/trace"))
import tr

url = f"http://127.0.0.1:{os.environ.get('PORT', '8123')}/v1/completions"
async def main():
    async with aiohttp.ClientSession() as c:
        for i in range(int(os.environ.get("N", "60"))):
            tr.t("c0 send"); first = None
            body = {"model": os.environ.get("MODEL", "lt"), "prompt": open(sys.argv[1]).read(), "max_tokens": int(os.environ.get("MAXT", "16")),
                    "temperature": 0, "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
            async with c.post(url, json=body) as r:
                async for data in r.content.iter_any():
                    if first is None and b"data: {" in data:
                        first = 1; tr.t("c1 first")
            tr.t("c2 done")
asyncio.run(main())
