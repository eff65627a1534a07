"""A client of an OpenAI-compatible ``/v1/completions`` server (vLLM, SGLang, ``transformers serve``).

``CompletionsClient(url, model, ...)`` sends raw prompts (no chat template: the engine's few-shot
prompts are continuations) and returns, for each ``CompletionRequest``, its ``n`` texts as the
server gave them. The texts are not cut at the stop strings here: the engine cuts them as its own
sampler does. vLLM leaves the stop string out of the text by default
(``include_stop_str_in_output`` in ``extra_body`` keeps it); other servers may keep it.

Samples of one request: a server that supports ``n`` gets one request with ``n`` and the
request's ``seed``. One that does not (``supports_n=False``: ``transformers serve`` accepts ``n``
and ignores it) gets ``n`` requests with ``n=1``; with ``n == 1`` the seed goes as it is, and with
``n > 1`` sample ``i`` gets ``sample_seed(seed, i)``: the first 31 bits of the SHA-256 of
``f"{seed}\\x1f{i}"`` (the engine's ``derive_seed(seed, i)``), so two questions' seeds never
collide the way ``seed + i`` would (question A's seed + 1 being question B's seed).

Faults: a 5xx, a timeout, a refused or dropped connection is retried up to ``retries`` times, the
``k``-th retry after ``backoff_seconds * 2**(k-1)`` seconds; then one ``UserError`` line names the
server's URL and what it last said (its status and the body's error message). A 4xx is not
retried: one line with the server's message. An answer whose ``model`` is not the requested model,
or with another number of choices than asked, is an error, never a sample taken as it is.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from star_engine import UserError
from star_engine.helpers import derive_seed

__all__ = ["CompletionRequest", "CompletionsClient", "sample_seed", "server_message"]

MESSAGE_CHARS = 300
RETRIED = (OSError, http.client.HTTPException)  # timeouts, refused/reset connections, disconnects


class CompletionRequest(NamedTuple):
    """One prompt's ``n`` samples."""

    prompt: str
    n: int
    seed: int
    temperature: float
    top_p: float
    max_tokens: int
    stop: tuple[str, ...] = ()


def sample_seed(seed: int, i: int) -> int:
    """The seed of sample ``i`` of a request seeded ``seed``, when its samples go one request each."""
    return int(derive_seed(seed, i))


def one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MESSAGE_CHARS else line[:MESSAGE_CHARS] + "..."


def server_message(body: bytes) -> str:
    """The error message of an answer's body, on one line: OpenAI's ``{"error": {"message"}}``,
    FastAPI's ``{"detail"}``, a ``{"message"}``, or the body's text."""
    text = body.decode("utf-8", "replace")
    try:
        data = json.loads(text)
    except ValueError:
        return one_line(text) or "(empty body)"
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and "message" in err:
            return one_line(str(err["message"]))
        for key in ("error", "detail", "message"):
            if data.get(key):
                value = data[key]
                return one_line(value if isinstance(value, str) else json.dumps(value))
    return one_line(text)


class Attempt(Exception):
    """A failed try that may be retried; ``str`` is what the server said."""


class CompletionsClient:
    """``models()``, ``health()`` and ``complete(requests)`` against one server."""

    def __init__(self, url: str, model: str, *, concurrency: int = 8, timeout_seconds: float = 600.0,
                 retries: int = 3, backoff_seconds: float = 1.0, extra_body: Mapping[str, Any] | None = None,
                 supports_n: bool = True):
        """``url``: the server's base, ``http(s)://host:port`` (a trailing ``/v1`` is dropped);
        ``model``: the name requests carry and answers must carry back; ``extra_body``: fields
        added to every completion request (e.g. vLLM's ``top_k``), overriding none of the
        sampling fields the engine sets."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UserError(f"server url {url!r} is not an http(s) URL (e.g. http://localhost:8000)")
        if concurrency < 1 or retries < 0 or timeout_seconds <= 0 or backoff_seconds < 0:
            raise UserError(f"server client for {url}: concurrency must be >= 1, retries >= 0, "
                            f"timeout_seconds > 0 and backoff_seconds >= 0")
        self.url = url.rstrip("/").removesuffix("/v1")
        self.scheme, self.host, self.port = parts.scheme, parts.hostname, parts.port
        self.base_path = parts.path.rstrip("/").removesuffix("/v1")
        self.model = model
        self.concurrency = concurrency
        self.timeout_seconds = timeout_seconds
        self.retries = retries
        self.backoff_seconds = backoff_seconds
        self.extra_body = dict(extra_body or {})
        self.supports_n = supports_n
        clash = sorted(set(self.extra_body) & {"model", "prompt", "max_tokens", "temperature", "top_p", "n",
                                               "seed", "stop"})
        if clash:
            raise UserError(f"server extra_body sets {', '.join(clash)}: the engine sets those fields itself")

    # -- one HTTP exchange ------------------------------------------------------------------
    def exchange(self, method: str, path: str, payload: Mapping[str, Any] | None = None) -> tuple[int, bytes]:
        """(status, body) of one request; connection faults and timeouts raise ``OSError`` or
        ``http.client.HTTPException``."""
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        conn = cls(self.host, self.port, timeout=self.timeout_seconds)
        try:
            body = None if payload is None else json.dumps(payload).encode()
            headers = {"Accept": "application/json"}
            if body is not None:
                headers["Content-Type"] = "application/json"
            conn.request(method, self.base_path + path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def call(self, method: str, path: str, payload: Mapping[str, Any] | None = None) -> Any:
        """The decoded JSON answer, retrying 5xx and connection faults; ``UserError`` otherwise."""
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_seconds * 2 ** (attempt - 1))
            try:
                status, body = self.exchange(method, path, payload)
            except TimeoutError:
                last = f"no answer within {self.timeout_seconds:g} s"
                continue
            except RETRIED as e:
                last = f"connection failed: {one_line(str(e)) or type(e).__name__}"
                continue
            if status >= 500:
                last = f"HTTP {status}: {server_message(body)}"
                continue
            if status >= 400:
                raise UserError(f"server {self.url} refused {method} {path}: HTTP {status}: {server_message(body)}")
            if status != 200:
                raise UserError(f"server {self.url} answered {method} {path} with HTTP {status}: "
                                f"{server_message(body)}")
            try:
                return json.loads(body)
            except ValueError:
                raise UserError(f"server {self.url} answered {method} {path} with a body that is not JSON: "
                                f"{server_message(body)}") from None
        tries = "1 try" if self.retries == 0 else f"{self.retries + 1} tries"
        raise UserError(f"server {self.url} failed {method} {path} after {tries}: {last}")

    # -- the API -----------------------------------------------------------------------------
    def health(self) -> bool:
        """Whether ``GET /health`` answers 200 (one try, no retry)."""
        try:
            status, _ = self.exchange("GET", "/health")
        except RETRIED:
            return False
        return status == 200

    def models(self) -> list[str]:
        """The model names ``GET /v1/models`` lists."""
        data = self.call("GET", "/v1/models")
        listed = data.get("data") if isinstance(data, dict) else None
        if not isinstance(listed, list):
            raise UserError(f"server {self.url} answered GET /v1/models without a data list: "
                            f"{one_line(json.dumps(data))}")
        return [str(m["id"]) for m in listed if isinstance(m, dict) and "id" in m]

    def payloads(self, req: CompletionRequest) -> list[dict[str, Any]]:
        """The POST bodies of one request: one with ``n``, or ``n`` with derived seeds."""
        if req.n < 1:
            raise ValueError(f"a completion request asks for n={req.n} samples (at least 1)")
        base = {"model": self.model, "prompt": req.prompt, "max_tokens": req.max_tokens,
                "temperature": req.temperature, "top_p": req.top_p, "stop": list(req.stop), **self.extra_body}
        if self.supports_n or req.n == 1:
            return [{**base, "n": req.n, "seed": req.seed}]
        return [{**base, "n": 1, "seed": sample_seed(req.seed, i)} for i in range(req.n)]

    def post(self, payload: dict[str, Any]) -> list[str]:
        """The texts of one POST /v1/completions, checked: the requested model, ``n`` choices."""
        data = self.call("POST", "/v1/completions", payload)
        if not isinstance(data, dict):
            raise UserError(f"server {self.url} answered POST /v1/completions with {type(data).__name__}, "
                            "not an object")
        if data.get("model") != self.model:
            raise UserError(f"server {self.url} answered with model {data.get('model')!r}, not the requested "
                            f"{self.model!r}: it does not serve the weights asked for")
        choices = data.get("choices")
        if not isinstance(choices, list) or not all(isinstance(c, dict) and isinstance(c.get("text"), str)
                                                    for c in choices):
            raise UserError(f"server {self.url} answered POST /v1/completions without choices[].text")
        if len(choices) != payload["n"]:
            raise UserError(f"server {self.url} answered {len(choices)} choices for n={payload['n']} "
                            "(a server that ignores n needs supports_n = false)")
        ordered = sorted(choices, key=lambda c: c.get("index", 0)) if all("index" in c for c in choices) else choices
        return [c["text"] for c in ordered]

    def complete(self, requests: Sequence[CompletionRequest]) -> list[list[str]]:
        """Each request's ``n`` texts, in request order, up to ``concurrency`` POSTs at once. The
        first failure cancels the POSTs not yet sent and raises its ``UserError``."""
        plans = [self.payloads(r) for r in requests]
        flat = [p for plan in plans for p in plan]
        pool = ThreadPoolExecutor(max_workers=min(self.concurrency, max(1, len(flat))),
                                  thread_name_prefix="completions")
        try:
            futures: list[Future[list[str]]] = [pool.submit(self.post, p) for p in flat]
            texts = [f.result() for f in futures]
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        out, at = [], 0
        for plan in plans:
            out.append([t for chunk in texts[at:at + len(plan)] for t in chunk])
            at += len(plan)
        return out
