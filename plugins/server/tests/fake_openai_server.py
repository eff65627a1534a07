"""A fake OpenAI-compatible server for the tests, told how to fail.

In a thread (``FakeServer``, the client tests): ``/health``, ``/v1/models`` and
``/v1/completions``, whose answers follow ``script``, one action per completion request in the
order they arrive, then ``"ok"``: ``"ok"``; ``("status", code, message)``; ``("sleep", seconds)``
(then ok, too late for a short client timeout); ``"drop"`` (the connection closed, no answer);
``("model", name)`` (ok, naming another model). A completion's text is ``prompt#seed#i``; with
``supports_n=False`` it answers one choice whatever ``n`` says (as ``transformers serve`` does).
It counts the completion requests in flight at once (``max_in_flight``).

As a script (the process tests: ``python fake_openai_server.py --port P --model M``): the same
server in a process, which can start a child process (``--child``: a process group of two),
ignore SIGTERM (``--ignore-term``, it and its child), exit at once with a message
(``--exit-code``), or list no model (``--no-models``); ``--pid-file`` gets ``{"server", "child"}``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class State:
    def __init__(self, model: str, script: list[Any] | None = None, supports_n: bool = True,
                 delay: float = 0.0, list_models: bool = True):
        self.model = model
        self.script = list(script or [])
        self.supports_n = supports_n
        self.delay = delay  # seconds each ok answer takes
        self.list_models = list_models
        self.lock = threading.Lock()
        self.bodies: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.loras: list[str] = []  # adapters loaded (vLLM's /v1/load_lora_adapter)
        self.calls: list[tuple[str, dict[str, Any]]] = []  # the load/unload POSTs, in order


class Handler(BaseHTTPRequestHandler):
    server: Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def answer(self, status: int, payload: Any) -> None:
        body = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:  # the client gave up (a timeout test)
            pass

    def do_GET(self) -> None:
        state = self.server.state
        if self.path == "/health":
            self.answer(200, {})
        elif self.path == "/v1/models":
            self.answer(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in
                                                         [state.model, *state.loras]] if state.list_models else []})
        else:
            self.answer(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        state = self.server.state
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        if self.path in ("/load_model", "/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            with state.lock:  # transformers serve's load, vLLM's runtime LoRA
                state.calls.append((self.path, body))
                if self.path == "/load_model":
                    state.model = body["model"]
                elif self.path == "/v1/load_lora_adapter":
                    state.loras.append(body["lora_name"])
                elif body["lora_name"] in state.loras:
                    state.loras.remove(body["lora_name"])
            self.answer(200, {"status": "ok"})
            return
        if self.path != "/v1/completions":
            self.answer(404, {"detail": "Not Found"})
            return
        with state.lock:
            state.bodies.append(body)
            action = state.script.pop(0) if state.script else "ok"
            state.in_flight += 1
            state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            self.act(state, action, body)
        finally:
            with state.lock:
                state.in_flight -= 1

    def act(self, state: State, action: Any, body: dict[str, Any]) -> None:
        kind = action if isinstance(action, str) else action[0]
        if kind == "drop":
            self.close_connection = True
            return
        if kind == "status":
            self.answer(action[1], {"error": {"message": action[2], "type": "fake", "code": action[1]}})
            return
        time.sleep(action[1] if kind == "sleep" else state.delay)
        n = body.get("n", 1) if state.supports_n else 1
        choices = [{"index": i, "text": f"{body['prompt']}#{body.get('seed')}#{i}", "finish_reason": "stop"}
                   for i in range(n)]
        served = body.get("model") if body.get("model") in state.loras else state.model
        self.answer(200, {"id": "cmpl-fake", "object": "text_completion",
                          "model": action[1] if kind == "model" else served, "choices": choices})


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, state: State):
        super().__init__(("127.0.0.1", port), Handler)
        self.state = state


class FakeServer:
    """``with FakeServer(State(...)) as fake:`` a server on a free port in a thread; ``fake.url``."""

    def __init__(self, state: State):
        self.state = state
        self.server = Server(0, state)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def __enter__(self) -> FakeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


SLEEPER = "import signal, sys, time\nif sys.argv[1] == '1': signal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(120)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--pid-file")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--ignore-term", action="store_true")
    ap.add_argument("--exit-code", type=int)
    ap.add_argument("--no-models", action="store_true")
    args = ap.parse_args()
    print(f"fake server starting on port {args.port} for {args.model}", flush=True)
    if args.exit_code is not None:
        print(f"fatal: cannot load {args.model}: out of memory", file=sys.stderr, flush=True)
        sys.exit(args.exit_code)
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", SLEEPER, "1" if args.ignore_term else "0"]) if args.child else None
    server = Server(args.port, State(args.model, list_models=not args.no_models))
    if args.pid_file:
        tmp = Path(args.pid_file + ".tmp")
        tmp.write_text(json.dumps({"server": os.getpid(), "child": child.pid if child else None}))
        tmp.replace(args.pid_file)
    server.serve_forever(poll_interval=0.05)


if __name__ == "__main__":
    main()
