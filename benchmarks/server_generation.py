"""One STaR iteration's generation (star_workload.py's ``addition`` mix) through this
engine's sampler and through an inference server serving the same weights, in the
same rounds. Prints ONE JSON line.

The mix: experiments/addition.toml's train questions of one iteration (``n_train_samples``:
700 since 2026-11-29, 1,000 before; generate), every second one hinted (rationalize) and the
250 dev questions (evaluate), each with a token budget of
its gold completion's length; byte tokenizer (end-of-text 256); the file's model and
generation batch size (``slots``). The weights are one random init, written as a
native checkpoint and exported as a Hugging Face folder (``export_hf``): both sides
run the very same numbers.

Sides:

- ``engine``: this engine's continuous-batching sampler, as star_workload.py's
  ``engine`` side (greedy, no end-of-text id so every row runs to its budget, the mix's
  slots, ``--chunk`` decode steps between refills, the shared prompt prefix prefilled once).
- ``server``: ``--server-command`` (default: ``transformers serve`` on the CPU with
  continuous batching) started through ``star_server.ServerProcess``, one
  ``POST /v1/completions`` per prompt (its text, ``max_tokens`` its budget, temperature
  0), ``--server-concurrency`` at once (default: the mix's slots). Each request carries
  ``transformers serve``'s per-request ``generation_config``: the folder's own, greedy,
  ``min_new_tokens`` = ``max_new_tokens`` = the budget and no end-of-text, so that each
  row runs exactly to its budget as on the engine side. ``server_exact_budgets`` says
  whether every answer's ``usage.completion_tokens`` was its budget; the server's useful
  tokens are what it produced, capped at each budget. (transformers 5.24 with
  ``--continuous-batching`` ignores ``min_new_tokens``: rows run to their budgets because
  ``eos_token_id`` None turns the end of text off. The first request's config sets the
  batching manager's; a later request's None keeps it, a later id is honoured.)

The server is started and warmed up (the first ``slots`` prompts) before any timing;
its start-up and warm-up seconds are reported as the engine's first (compiling) call
is. Every side runs the whole mix once per round, the order rotating between rounds;
ratios are medians of the per-round ratios normalised by each side's useful tokens
(wall time; ``_cpu``: CPU time, the engine's process against the server's process
group, the client's threads left out). The server is stopped on every way out.

    python benchmarks/server_generation.py --rounds 3
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shlex
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench_common import cpu_name, logged, paired_ratio, rotate, summarise, threads, timed
from star_workload import addition_mix

TRANSFORMERS = Path(sys.executable).parent / "transformers"  # the venv's console script, not PATH's
SERVE = (shlex.quote(str(TRANSFORMERS)) if TRANSFORMERS.exists() else "transformers") + \
    " serve {model} --host 127.0.0.1 --port {port} --device cpu --continuous-batching"
REQUEST_TIMEOUT = 3600.0
SIDES = ("engine", "server")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--addition-requests", type=int, default=0, help="an even sample of N (0: all 1,750)")
    ap.add_argument("--server-command", default=SERVE, help="a command line with {model} and {port}")
    ap.add_argument("--server-concurrency", type=int, default=None, help="requests in flight (default: slots)")
    ap.add_argument("--chunk", type=int, default=16, help="the engine's decode steps between refills")
    ap.add_argument("--layers", type=int, default=None, help="override n_layer (smoke tests)")
    return ap.parse_args(argv)


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def group_cpu(pgid: int) -> float:
    """CPU seconds (user + system) of process group ``pgid``'s live processes and of the
    children they reaped, from /proc (``group_members``: utime stime cutime cstime)."""
    from star_server.process import group_members

    return sum(int(x) for fields in group_members(pgid) if len(fields) > 14
               for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def native_weights(mix: dict, workdir: Path) -> tuple[Any, str]:
    """(backend, checkpoint): a random init of the mix's model (seed 0) as a native checkpoint."""
    from star_haiku_xmap.plugin import HaikuXmapBackend

    backend = HaikuXmapBackend.from_table(preset="tiny", tokenizer="byte", **mix["model"])
    return backend, backend.base(workdir, 0)


def engine_call(a, mix: dict, backend, checkpoint: str, stats: dict):
    """star_workload's ``engine`` side (continuous batching, prefix shared) on the checkpoint's weights."""
    from star_haiku_xmap.options import DecodeConfig
    from star_haiku_xmap.sampling import continuous

    params = backend.load_params(checkpoint)
    decode = DecodeConfig(temperature=0.0, top_p=1.0, eos_id=-1, pad_id=mix["pad"], slots=mix["slots"],
                          chunk=a.chunk)
    args = (params, mix["prompts"], list(range(len(mix["prompts"]))), mix["budgets"])

    def cont() -> None:
        out = continuous.generate(*args, decode=decode, stats=stats, config=backend.config, mesh=backend.mesh)
        assert [len(t) for t in out] == mix["budgets"]

    return cont


class ServerCall:
    """The whole mix through the server, ``concurrency`` requests in flight; ``__call__``
    gives (wall, the server group's CPU) seconds and keeps each answer's usage."""

    def __init__(self, server, folder: Path, mix: dict, concurrency: int):
        from star_server import CompletionsClient

        self.pgid = server.pid  # the server leads its own process group
        self.concurrency = concurrency
        self.client = CompletionsClient(server.url, server.models[0], concurrency=concurrency,
                                        timeout_seconds=REQUEST_TIMEOUT, retries=0)
        gen = json.loads((folder / "generation_config.json").read_text())
        self.payloads = [{"model": server.models[0], "prompt": bytes(p).decode("utf-8"), "max_tokens": n,
                          "temperature": 0,
                          "generation_config": json.dumps({**gen, "do_sample": False, "top_k": 0, "max_new_tokens": n,
                                                           "min_new_tokens": n, "eos_token_id": None})}
                         for p, n in zip(mix["prompts"], mix["budgets"])]
        self.usage: list[list[tuple[int, int]]] = []  # per call: (prompt, completion) tokens of each request

    def post(self, payload: dict) -> tuple[int, int]:
        usage = self.client.call("POST", "/v1/completions", payload)["usage"]
        return int(usage["prompt_tokens"]), int(usage["completion_tokens"])

    def run(self, payloads: list[dict]) -> list[tuple[int, int]]:
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(payloads))) as pool:
            return list(pool.map(self.post, payloads))

    def __call__(self) -> tuple[float, float]:
        c, t = group_cpu(self.pgid), time.perf_counter()
        self.usage.append(self.run(self.payloads))
        return time.perf_counter() - t, group_cpu(self.pgid) - c


def main(argv=None) -> None:
    a = parse_args(argv)
    mix = addition_mix(a)
    if a.layers:
        mix["model"]["n_layer"] = a.layers
    concurrency = a.server_concurrency or mix["slots"]
    budgets = mix["budgets"]
    result: dict[str, Any] = {
        "cpu": cpu_name(), "threads": threads(), "loadavg_start": round(os.getloadavg()[0], 2),
        "transformers": version("transformers"), "torch": version("torch"), "jax": version("jax"),
        "server_command": a.server_command, "server_concurrency": concurrency, "rounds": a.rounds, "chunk": a.chunk,
        "requests": len(budgets), "slots": mix["slots"], "model": mix["model"]}
    from star_server import ServerProcess

    with tempfile.TemporaryDirectory(prefix="server_generation_") as tmp:
        backend, checkpoint = native_weights(mix, Path(tmp))
        folder = Path(tmp) / "hf"
        backend.export_hf(checkpoint, folder)
        start = time.perf_counter()
        with ServerProcess(a.server_command, folder, Path(tmp) / "server.log") as server:
            result["server_startup_s"] = round(time.perf_counter() - start, 2)
            served = ServerCall(server, folder, mix, concurrency)
            warm = served.payloads[:mix["slots"]]
            result["server_first_call_s"] = round(timed(lambda: served.run(warm))[0], 2)  # noqa: B023
            stats: dict = {}
            cont = engine_call(a, mix, backend, checkpoint, stats)
            result["engine_first_call_s"] = round(logged("engine (first call)", lambda: timed(cont))()[0], 2)
            calls = [logged("engine", lambda: timed(cont)), logged("server", served)]
            times = dict(zip(SIDES, rotate(calls, a.rounds)))
    result["engine_stats"] = stats
    produced = [min(n, got) for n, (_, got) in zip(budgets, served.usage[-1])]
    exact = all([got for _, got in call] == budgets for call in served.usage)
    tokens = {"engine": sum(budgets), "server": sum(produced)}
    result.update(useful_tokens=tokens["engine"], server_useful_tokens=tokens["server"], server_exact_budgets=exact,
                  server_prompt_tokens_exact=all([p for p, _ in call] == [len(x) for x in mix["prompts"]]
                                                 for call in served.usage))
    if not exact:
        result["server_budgets_note"] = (f"{sum(got != n for n, (_, got) in zip(budgets, served.usage[-1]))} of "
                                         f"{len(budgets)} requests did not produce their budget (min_new_tokens "
                                         "or eos_token_id=None not honoured); the server's useful tokens are its own")
    for side, t in times.items():
        s = summarise(side, t, tokens[side])
        result.update({k: s[k] for k in (f"{side}_tokens_per_s", f"{side}_tokens_per_s_median", f"{side}_s",
                                         f"{side}_cpu_s")})
    scale = tokens["engine"] / tokens["server"]
    for idx, suffix in ((0, ""), (1, "_cpu")):
        result[f"engine_over_server{suffix}"] = round(paired_ratio(times["engine"], times["server"], idx) * scale, 2)
    result["server_cpu_is"] = "user+system CPU of the server's process group (/proc), the client's threads excluded"
    result["loadavg_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
