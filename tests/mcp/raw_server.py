"""A hostile MCP server speaking JSON-RPC over stdio by hand: ``python raw_server.py``.

``pid`` answers the process id; ``stall`` blocks the whole server for good; ``endless`` starts its answer and never
ends the line, writing for ever.
"""

from __future__ import annotations

import json
import os
import sys
import time

TOOLS = [
    {"name": name, "description": f"{name}.", "inputSchema": {"type": "object", "properties": {}}}
    for name in ("pid", "stall", "endless")
]


def answer(request_id: object, result: object) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}) + "\n")
    sys.stdout.flush()


def main() -> None:
    for line in sys.stdin:
        message = json.loads(line)
        method, request_id = message.get("method"), message.get("id")
        if request_id is None:
            continue  # a notification
        if method == "initialize":
            version = message["params"]["protocolVersion"]
            info = {"name": "raw", "version": "1"}
            answer(request_id, {"protocolVersion": version, "capabilities": {"tools": {}}, "serverInfo": info})
        elif method == "tools/list":
            answer(request_id, {"tools": TOOLS})
        elif method == "tools/call" and message["params"]["name"] == "pid":
            answer(request_id, {"content": [{"type": "text", "text": str(os.getpid())}]})
        elif method == "tools/call" and message["params"]["name"] == "stall":
            time.sleep(3600)
        elif method == "tools/call" and message["params"]["name"] == "endless":
            sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request_id})[:-1] + ', "result": {"content": "')
            while True:
                sys.stdout.write("x" * 65536)
                sys.stdout.flush()
        else:
            answer(request_id, {})


if __name__ == "__main__":
    main()
