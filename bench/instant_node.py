"""Instant fake nodes for control-plane benchmarks: ``python bench/instant_node.py PORT...``.

One asyncio process serves every given port on 127.0.0.1 with the least a node answers (HTTP/1.1,
keep-alive): ``GET /health`` 200, ``GET /metrics`` an idle node's figures, and any ``POST`` a
finished, non-streamed ``chat.completion`` at once, with no model behind it. What a request
costs through the control plane against one of these is what the control plane itself costs.
"""

from __future__ import annotations

import asyncio
import json
import sys

COMPLETION = json.dumps(
    {
        "id": "chatcmpl-instant",
        "object": "chat.completion",
        "created": 0,
        "model": "instant",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
).encode()
HEALTH = b'{"status": "ok"}'
METRICS = b'phalanx_node_busy 0\nphalanx_node_sequences{state="active"} 0\n'


def _response(body: bytes, content_type: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: " + content_type
    return head + b"\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body


ANSWERS = {
    b"POST": _response(COMPLETION, b"application/json"),
    b"/health": _response(HEALTH, b"application/json"),
    b"/metrics": _response(METRICS, b"text/plain; version=0.0.4"),
}


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            method, path = head.split(b" ", 2)[:2]
            length = 0
            for line in head.lower().split(b"\r\n"):
                if line.startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            if length:
                await reader.readexactly(length)
            key = b"POST" if method == b"POST" else path.split(b"?")[0]
            writer.write(ANSWERS.get(key, ANSWERS[b"/health"]))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main(ports: list[int]) -> None:
    servers = [await asyncio.start_server(_serve, "127.0.0.1", port) for port in ports]
    print("listening", " ".join(map(str, ports)), flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


if __name__ == "__main__":
    asyncio.run(main([int(p) for p in sys.argv[1:]]))
