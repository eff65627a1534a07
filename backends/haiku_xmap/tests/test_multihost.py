"""Multi-process JAX on one machine: 2 processes x 4 simulated CPU devices
(127.0.0.1 only, gloo collectives) train a few steps on a (dp, mp) mesh spanning
both and get the same losses and parameters as 1 process with 8 devices.
Process 0 initialises from a ``[model] distributed`` table, process 1 from the
``STAR_ENGINE_*`` environment variables."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from star_engine.errors import UserError
from star_haiku_xmap.session import distributed

WORKER = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    mode, pid, port, work = sys.argv[1], int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    adapter = {"kind": "lora", "rank": 4} if sys.argv[5:] == ["lora"] else None
    from star_engine.api import GenRequest, GenSpec, TrainExample, TrainSpec
    from star_haiku_xmap.plugin import HaikuXmapBackend

    # process 0: the [model] distributed table; process 1: the environment (set by the test)
    table = {"coordinator": f"127.0.0.1:{port}", "num_processes": 2, "process_id": 0}
    backend = HaikuXmapBackend.from_table(preset="tiny", seq_len=64, mesh={"dp": 2, "mp": 4}, zero=1,
                               distributed=table if mode == "multi" and pid == 0 else None)
    import jax

    examples = [TrainExample(prompt=f"{a} + {b} =", completion=f" {a + b}.") for a in range(7) for b in range(5)]
    base = backend.base(work, seed=0)
    res = backend.train(base, work / "ft", examples, TrainSpec(steps=3, batch_size=8, grad_accum=2, seed=0,
                                                              optimizer={"lr": 3e-3, "warmup_steps": 0},
                                                              adapter=adapter))
    gens = backend.generate(res.checkpoint, [GenRequest(prompt=f"{i} + 1 =", seed=i) for i in range(6)],
                            GenSpec(max_new_tokens=6, temperature=0.0, top_p=1.0, stop=(), batch_size=4))
    out = {"process_count": jax.process_count(), "devices": jax.device_count(), "local": jax.local_device_count(),
           "losses": list(res.losses), "tokens": res.tokens, "id": res.checkpoint_id, "gens": gens,
           "base_written": (work / "base_init" / "manifest.msgpack").is_file(),
           "opt_spec": None}
    print("RESULT " + json.dumps(out), flush=True)
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(devices: int, extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STAR_ENGINE_", "JAX_COORDINATOR"))}
    env.update({"XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu"})
    env.update(extra or {})
    return env


def _result(stdout: str) -> dict:
    line = next(x for x in stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@pytest.mark.slow  # kept out of the default run for its time (~15 minutes); CI's slow step runs it
@pytest.mark.parametrize("adapter", [None, "lora"])
def test_two_processes_match_one_process(tmp_path, adapter):
    """The backend on dp 2 x mp 4 with ZeRO-1 (each process holds one data-parallel
    replica, so the gradient all-reduce and the optimizer-state gathers cross
    processes): random base model, 3 training steps (of every weight, or of LoRA
    adapters), greedy sampling. Process 0 writes the checkpoints into the shared
    folder, both read them."""
    port = _free_port()
    lora = [adapter] if adapter else []
    procs = []
    for pid in (0, 1):
        extra = {} if pid == 0 else {"STAR_ENGINE_COORDINATOR": f"127.0.0.1:{port}",
                                     "STAR_ENGINE_NUM_PROCESSES": "2", "STAR_ENGINE_PROCESS_ID": "1"}
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER, "multi", str(pid), str(port),
                                       str(tmp_path / "multi"), *lora], env=_env(4, extra), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        assert p.returncode == 0, stderr[-3000:]
        outs.append(_result(stdout))
    single = subprocess.run([sys.executable, "-c", WORKER, "single", "0", "0", str(tmp_path / "single"), *lora],
                            env=_env(8), capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr[-3000:]
    ref = _result(single.stdout)
    assert (ref["process_count"], ref["devices"]) == (1, 8)
    for o in outs:
        assert (o["process_count"], o["devices"], o["local"]) == (2, 8, 4)
        assert o["tokens"] == ref["tokens"] and o["base_written"]
        np.testing.assert_allclose(o["losses"], ref["losses"], rtol=1e-5)
    assert outs[0] == outs[1]  # one checkpoint (same id), the same generations on both processes
    assert len(outs[0]["gens"]) == 6
    print(f"2 processes: losses {outs[0]['losses']}\n1 process:   losses {ref['losses']}\n"
          f"generations equal to the 1-process run: {outs[0]['gens'] == ref['gens']}")


def test_resolve_options_from_table_and_environment():
    assert distributed.resolve_options(None, {}) is None
    env = {"STAR_ENGINE_COORDINATOR": "10.0.0.1:1234", "STAR_ENGINE_NUM_PROCESSES": "4",
           "STAR_ENGINE_PROCESS_ID": "3"}
    assert distributed.resolve_options(None, env) == {"coordinator": "10.0.0.1:1234", "num_processes": 4,
                                                      "process_id": 3, "local_device_ids": None}
    # the table wins, the environment fills what it leaves out (typically the process id)
    got = distributed.resolve_options({"coordinator": "h:1", "num_processes": 2}, {"STAR_ENGINE_PROCESS_ID": "1"})
    assert got == {"coordinator": "h:1", "num_processes": 2, "process_id": 1, "local_device_ids": None}
    assert distributed.resolve_options("auto", {}) == {"auto": True}
    for bad, msg in [({"coordinator": "h:1", "num_processes": 2, "process_id": 2}, "must lie in"),
                     ({"coordinator": "nohost", "num_processes": 2, "process_id": 0}, "host:port"),
                     ({"coordinator": "h:1", "num_processes": 2}, "process_id: required"),
                     ({"coordinator": "h:1", "num_processes": 2, "process_id": 0, "rank": 1}, "unknown keys"),
                     ("yes", "must be a table")]:
        with pytest.raises(UserError, match=msg):
            distributed.resolve_options(bad, {})


RUN_TOML = """
[experiment]
name = "addition_multihost"
seed = 0
output_dir = "{out}"
iterations = 2

[task]
dataset = "addition"
options = {{ seed = 0, n_train = 24, n_dev = 12, min_digits = 1, max_digits = 2, n_seed = 16, seed_max_digits = 2 }}
filters = ["hint_leak"]

[generation]
max_new_tokens = 24
batch_size = 8

[rationalization]
enabled = true

[base_training]
steps = 3
batch_size = 4

[training]
schedule = {{ name = "steady_grow", start_steps = 2, add_steps = 1 }}
batch_size = 4

[model]
backend = "haiku_xmap"
seq_len = 256
mesh = {{ dp = 2, mp = 4 }}
"""


def _files(root) -> list[str]:
    """The run's files; TensorBoard's event file, named by its creation time, as ``tensorboard/events``."""
    names = (p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    return sorted("tensorboard/events" if n.startswith("tensorboard/events.out.tfevents.") else n for n in names)


@pytest.mark.slow
def test_star_engine_run_on_two_processes_writes_one_run_directory(tmp_path):
    """`star-engine run` as 2 processes x 4 devices (the environment names the
    coordinator): process 0 alone writes the shared run directory, the other
    waits at each change; the folder holds the same files and rows as a
    1-process, 8-device run, one event log with each event once, no leftovers;
    a rerun of the finished run on 2 processes does no work and changes nothing."""
    import pandas as pd

    def start(out, devices, env_extra):
        cfg = tmp_path / f"{out}.toml"
        cfg.write_text(RUN_TOML.format(out=tmp_path / out))
        return subprocess.Popen([sys.executable, "-m", "star_engine", "run", str(cfg), "--quiet"],
                                env=_env(devices, env_extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    def two_processes():
        port = _free_port()
        ps = [start("multi", 4, {"STAR_ENGINE_COORDINATOR": f"127.0.0.1:{port}",
                                 "STAR_ENGINE_NUM_PROCESSES": "2", "STAR_ENGINE_PROCESS_ID": str(pid)})
              for pid in (0, 1)]
        try:
            outs = [p.communicate(timeout=400) for p in ps]
        finally:
            for p in ps:
                p.kill()
        for p, (_, err) in zip(ps, outs):
            assert p.returncode == 0, err[-3000:]

    two_processes()
    single = start("single", 8, {})
    _, err = single.communicate(timeout=400)
    assert single.returncode == 0, err[-3000:]

    multi, one = tmp_path / "multi", tmp_path / "single"
    assert _files(multi) == _files(one)
    assert not [f for f in _files(multi) if ".tmp-" in f]
    events = [json.loads(x)["event"] for x in (multi / "events.jsonl").read_text().splitlines()]
    assert events.count("start") == 1 and events.count("iteration_done") == 3 and events.count("run_finished") == 1
    for rel in ("metrics.parquet", "iterations/001/generated.parquet", "iterations/002/rationales.parquet"):
        a, b = pd.read_parquet(multi / rel), pd.read_parquet(one / rel)
        assert list(a.columns) == list(b.columns) and len(a) == len(b), rel
    manifest = json.loads((multi / "manifest.json").read_text())
    assert manifest["finished"] and manifest["backend"]["processes"] == 2
    for rel, rec in manifest["artifacts"].items():  # every recorded file is the one on disk
        assert hashlib.sha256((multi / rel).read_bytes()).hexdigest() == rec["sha256"], rel

    logs = ("events.jsonl", "tensorboard/events", ".lock")  # the lock names the process holding it
    before = {f: (multi / f).read_bytes() for f in _files(multi) if f not in logs}
    two_processes()
    after = {f: (multi / f).read_bytes() for f in _files(multi) if f not in logs}
    changed = [f for f in before if before[f] != after.get(f)]
    assert set(after) == set(before) and changed in ([], ["manifest.json"], ["config.json", "manifest.json"])
