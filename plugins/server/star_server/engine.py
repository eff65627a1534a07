"""``[generation] engine = "server"``: the run's prompts sampled by an OpenAI-compatible inference
server (vLLM, SGLang, ``transformers serve``) through ``/v1/completions`` (raw prompts, no chat
template: the few-shot prompts are continuations).

Before a chunk is sampled from a checkpoint, the engine makes the server serve exactly it
(``ServerEngine.serve``): the backend exports the checkpoint as a Hugging Face folder
``RUN_DIR/served/<checkpoint id>/`` (``Backend.export_hf``; a LoRA checkpoint merged), whose
content hash (``folder_sha256``) is recorded in ``RUN_DIR/served/served.json`` and checked again
whenever the folder is reused; then the server is made to serve that folder, by ``load``:

- ``restart`` (``command`` mode's default): the engine's server is started (again) with
  ``{model}`` the folder;
- ``load_model`` (a ``url`` of ``transformers serve``): ``POST /load_model {"model": folder}``;
- ``none``: the server is expected to serve the folder already.

The model a request names is the folder's path, which holds the checkpoint's id; after loading,
``GET /v1/models`` must list it and every answer must carry it back (``CompletionsClient``),
else the stage stops with one line: a server that does not serve the version asked for is an
error, never a silent sample from other weights. Each row the run writes records the folder's
hash (``model_version``) and ``"<url> <model>"`` (``sampled_by``).

Sampling as the backend's own sampler does: each request's seed (derived by the run from the
experiment's seed, iteration, question and sample) goes with it; a prompt longer than the
backend keeps is cut as the backend cuts it (``Backend.fit_prompt``); the texts are cut before
the first stop string (``cut_at_stop``); ``max_new_tokens`` is ``max_tokens``. ``kind`` says
which server it is: ``vllm``, ``sglang`` and ``openai`` take ``n`` (consecutive requests with the
same prompt go as one request, with the first one's seed), ``transformers`` does not (one request
per sample) and samples only with a generation config that says so (``do_sample``, ``top_k = 0``
as the backend's sampler has no top-k), which the engine sends from the folder's own
``generation_config.json``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from star_engine import (GenRequest, GenSpec, NonNegInt, PosInt, Progress, Section, UserError, above, at_least)
from star_engine.helpers import atomic_write_json, cut_at_stop

from .client import CompletionRequest, CompletionsClient
from .process import ServerProcess, check_command, log_tail

__all__ = ["ServerEngine", "ServerOptions", "cut_at_stop", "folder_sha256"]

KEY = "generation.server"


@dataclass(frozen=True, kw_only=True)
class ServerOptions(Section):
    """The ``[generation.server]`` table."""

    url: str = ""  # a server the user runs: http(s)://host:port
    command: str = ""  # or a command line the engine runs, with {model} and {port}
    api: Literal["completions"] = "completions"
    kind: Literal["vllm", "sglang", "transformers", "openai"] = "vllm"
    # How the server is made to serve a checkpoint: auto: restart (command) / none (url);
    # load_lora_adapter: a LoRA checkpoint's adapters alone (vLLM --enable-lora), its base as auto.
    load: Literal["auto", "restart", "load_model", "load_lora_adapter", "none"] = "auto"
    concurrency: PosInt = 8
    timeout_seconds: Annotated[float, above(0)] = 600.0  # one request's
    startup_timeout_seconds: Annotated[float, above(0)] = 600.0  # a started server's /health and /v1/models
    retries: NonNegInt = 3
    backoff_seconds: Annotated[float, at_least(0)] = 1.0
    extra_body: dict = field(default_factory=dict)  # added to every request (e.g. vLLM's top_k)
    keep_exports: bool = False  # keep every iteration's exported folder (default: the one served)


def folder_sha256(folder: Path) -> str:
    """The SHA-256 of a folder's files: of each relative path and its bytes' SHA-256, in order."""
    outer = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        inner = hashlib.sha256()
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                inner.update(block)
        outer.update(f"{f.relative_to(folder).as_posix()}\0{inner.hexdigest()}\n".encode())
    return outer.hexdigest()


class ServerEngine:
    """A ``GenerationEngine`` (``star_engine.GenerationEngine``) over one inference server."""

    Options = ServerOptions

    def __init__(self, options: ServerOptions) -> None:
        if bool(options.url) == bool(options.command):
            raise UserError(f"{KEY}: give either url (a server you run) or command (one the engine starts), "
                            f"{'not both' if options.url else 'neither is set'}", key=KEY)
        if options.command:
            try:
                check_command(options.command)
            except UserError as e:
                raise UserError(f"{KEY}.command: {e}", key=f"{KEY}.command") from None
        # auto: the run's own server restarted; a url: transformers serve loads by /load_model, others as they are
        auto = "restart" if options.command else ("load_model" if options.kind == "transformers" else "none")
        load = options.load if options.load != "auto" else auto
        self.adapters = load == "load_lora_adapter"
        if self.adapters:  # whole models (the base, a run without adapters) as auto
            load = auto
        if load == "restart" and not options.command:
            raise UserError(f"{KEY}.load: \"restart\" needs a command the engine runs (url is a server you run: "
                            "load = \"load_model\" or \"none\")", key=f"{KEY}.load")
        self.options, self.load = options, load
        try:  # checks the URL and extra_body now, before anything is written
            self.client = CompletionsClient(options.url or "http://127.0.0.1:1", "", **self._client_options())
        except UserError as e:
            field_ = "url" if "url" in str(e) and "extra_body" not in str(e) else "extra_body"
            raise UserError(f"{KEY}.{field_}: {e}", key=f"{KEY}.{field_}") from None
        self.process: ServerProcess | None = None
        self.run_dir: Path | None = None
        self.backend: Any = None
        self.current: tuple[str, str] | None = None  # (model name, sha256) the requests name now
        self.whole: str | None = None  # the whole model's folder the server serves (a LoRA run: the base)
        self.folders: dict[str, str] = {}  # an adapter's name -> its folder
        self.exported: dict[tuple[str, str | None], tuple[str, str]] = {}  # (checkpoint, base) -> (folder, hash)
        self.last: tuple[str, str] = ("", "")

    def _client_options(self) -> dict[str, Any]:
        o = self.options
        return {"concurrency": o.concurrency, "timeout_seconds": o.timeout_seconds, "retries": o.retries,
                "backoff_seconds": o.backoff_seconds, "extra_body": o.extra_body,
                "supports_n": o.kind != "transformers"}

    # -- the GenerationEngine protocol ----------------------------------------------------
    def validate(self, backend: Any) -> None:
        if not callable(getattr(backend, "export_hf", None)):
            raise UserError(f"generation.engine: the backend ({type(backend).__name__}) has no export_hf: it cannot "
                            "write the Hugging Face folder a server loads", key="generation.engine")
        check = getattr(backend, "check_export_hf", None)
        if callable(check):  # the model's architecture and tokenizer exported, before the run
            check()
        if self.adapters and not all(callable(getattr(backend, m, None)) for m in ("adapter_base", "export_adapter")):
            raise UserError(f"{KEY}.load: \"load_lora_adapter\": the backend ({type(backend).__name__}) does not export "
                            "adapters (adapter_base, export_adapter)", key=f"{KEY}.load")
        if self.options.url:
            self.reachable()

    def reachable(self) -> list[str]:
        """The models a ``url`` server lists, polled until ``startup_timeout_seconds``: a server
        that does not answer is refused before the run writes anything."""
        deadline, last = time.monotonic() + self.options.startup_timeout_seconds, ""
        while True:
            try:
                return self.client.models()
            except UserError as e:
                last = str(e)
            if time.monotonic() >= deadline:
                raise UserError(f"{KEY}.url: {self.client.url} did not answer GET /v1/models within "
                                f"{self.options.startup_timeout_seconds:g} s: {last}", key=f"{KEY}.url")
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))

    def start(self, run_dir: Path, backend: Any) -> None:
        """The run's directory and backend (``validate`` checked the backend before the run began)."""
        self.run_dir, self.backend = Path(run_dir), backend

    def close(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None
        self.current = self.whole = None

    def provenance(self) -> tuple[str, str]:
        return self.last

    def generate(self, checkpoint: str, requests: Sequence[GenRequest], spec: GenSpec,
                 progress: Progress | None = None) -> list[str]:
        if not requests:
            return []
        folder, sha = self.serve(checkpoint)
        fit = getattr(self.backend, "fit_prompt", None)
        prompts = [fit(r.prompt, spec) if callable(fit) else r.prompt for r in requests]
        if self.options.kind == "transformers":
            self.client.extra_body = {**self.options.extra_body, "generation_config": self.generation_config(folder, spec)}
        groups: list[CompletionRequest] = []
        for p, r in zip(prompts, requests):
            if self.client.supports_n and groups and groups[-1].prompt == p:
                groups[-1] = groups[-1]._replace(n=groups[-1].n + 1)
            else:
                groups.append(CompletionRequest(p, 1, r.seed, spec.temperature, spec.top_p, spec.max_new_tokens,
                                                tuple(spec.stop)))
        try:
            answers = self.client.complete(groups)
        except UserError as e:
            raise UserError(f"{e}{self._exited()}") from None
        texts = [cut_at_stop(t, spec.stop) for texts in answers for t in texts]
        if progress is not None:
            progress(len(requests))
        self.last = (sha, f"{self.client.url} {self.client.model}")
        return texts

    def _exited(self) -> str:
        """What a failure adds when the engine's server process has ended: its exit code and log."""
        proc = self.process.proc if self.process is not None else None
        if proc is None or proc.poll() is None:
            return ""
        assert self.process is not None
        return (f"; the server process exited with code {proc.returncode}, its log {self.process.log_path} ends: "
                f"{log_tail(self.process.log_path)}")

    # -- the weights served ---------------------------------------------------------------
    def serve(self, checkpoint: str) -> tuple[str, str]:
        """Make the server serve exactly ``checkpoint`` (exported, hashed, loaded, checked):
        (the model name requests carry, the export's hash)."""
        base = self.backend.adapter_base(checkpoint) if self.adapters else None
        if base is None:
            name, sha = self.export(checkpoint)
            if self.current != (name, sha):
                self._serve_whole(name)
        else:  # vLLM's runtime LoRA: the base served whole, the adapters loaded by name
            base_folder, _ = self.export(base)
            folder, sha = self.export(checkpoint, adapter_over=base_folder)
            name = f"star-{sha[:16]}"
            self.folders[name] = folder
            if self.current != (name, sha):
                if self.whole != base_folder:
                    self._serve_whole(base_folder)
                self.client.call("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": folder})
        if self.current != (name, sha):
            self.client.model = name
            listed = self.client.models()
            if name not in listed:
                raise UserError(f"server {self.client.url} does not serve model version {sha[:16]} ({name}); "
                                f"GET /v1/models lists {listed}: refusing to sample from other weights")
            self._forget(self.current, name)
            self.current = (name, sha)
        return self.current

    def _serve_whole(self, folder: str) -> None:
        """The server serves the whole model ``folder``: restarted with it, loaded, or (``none``) as it is."""
        if self.load == "restart":
            self._restart(folder)
        elif self.load == "load_model":
            self.client.call("POST", "/load_model", {"model": folder})
        self.whole = folder

    def _forget(self, previous: tuple[str, str] | None, now: str) -> None:
        """After a switch: the adapter served before unloaded; the folder served before removed
        unless it is still the base served or ``keep_exports`` keeps it."""
        if previous is None or previous[0] == now:
            return
        name = previous[0]
        if self.adapters and name.startswith("star-"):
            self.client.call("POST", "/v1/unload_lora_adapter", {"lora_name": name})
        folder = self.folders.get(name, name)
        if not self.options.keep_exports and folder != self.whole:
            shutil.rmtree(folder, ignore_errors=True)

    def _restart(self, folder: str) -> None:
        assert self.run_dir is not None
        if self.process is None:
            self.process = ServerProcess(self.options.command, folder, self.run_dir / "served" / "server.log",
                                         timeout_seconds=self.options.startup_timeout_seconds)
            self.process.start()
        else:
            self.process.restart(folder)
        self.client = CompletionsClient(self.process.url, folder, **self._client_options())

    def export(self, checkpoint: str, adapter_over: str | None = None) -> tuple[str, str]:
        """``RUN_DIR/served/<checkpoint id>/``: the checkpoint as an HF folder, or (``adapter_over``:
        the served base's folder) its adapters alone as a peft folder; written once, its recorded
        hash checked whenever it is reused (written again when it differs). (folder, hash)."""
        assert self.run_dir is not None, "start() first"
        key = (checkpoint, adapter_over)
        if key in self.exported and Path(self.exported[key][0]).exists():  # hashed once per run process
            return self.exported[key]
        ident = str(self.backend.checkpoint_id(checkpoint))
        root = self.run_dir / "served"
        name = ident[:16] + ("-adapter" if adapter_over else "")
        folder, record = root / name, root / "served.json"
        served = json.loads(record.read_text()) if record.exists() else {}
        want = served.get(name, {}).get("sha256")
        if folder.exists() and want and folder_sha256(folder) == want:
            self.exported[key] = (str(folder), want)
            return self.exported[key]
        shutil.rmtree(folder, ignore_errors=True)  # unrecorded (a kill mid-export) or changed since
        root.mkdir(parents=True, exist_ok=True)
        if adapter_over:
            summary = self.backend.export_adapter(checkpoint, folder, adapter_over)
        else:
            summary = self.backend.export_hf(checkpoint, folder)
        sha = folder_sha256(folder)
        served[name] = {"checkpoint": str(checkpoint), "checkpoint_id": ident, "sha256": sha,
                        "kind": "peft adapter" if adapter_over else "hf model", "base": adapter_over,
                        "export": json.loads(json.dumps(summary, default=str))}
        atomic_write_json(record, served)
        self.exported[key] = (str(folder), sha)
        return self.exported[key]

    @staticmethod
    def generation_config(folder: str, spec: GenSpec) -> str:
        """``transformers serve``'s per-request generation config: the folder's own (end of text,
        suppressed tokens) with the engine's sampling (it samples only when ``do_sample``; HF's
        default ``top_k`` of 50 is turned off)."""
        path = Path(folder) / "generation_config.json"
        base = json.loads(path.read_text()) if path.exists() else {}
        sample = spec.temperature > 0
        return json.dumps({**base, "do_sample": sample, "temperature": spec.temperature if sample else 1.0,
                           "top_p": spec.top_p if sample else 1.0, "top_k": 0, "max_new_tokens": spec.max_new_tokens})
