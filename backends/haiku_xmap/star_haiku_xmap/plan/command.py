"""The memory plan, checked by the compiler: compile GPT-J's train step and its
sampler for a (dp, mp) mesh with abstract parameters and print XLA's per-device
memory analysis.

Nothing is allocated: parameters, optimizer state, batches and the KV cache are
``jax.ShapeDtypeStruct``s carrying their ``NamedSharding``s; ``jit(...).lower(...)
.compile()`` partitions the program for the mesh and ``compiled.memory_analysis()``
reports, per device, the bytes of the arguments, outputs (less what aliases a
donated argument) and XLA's temporaries. The mesh is simulated with host CPU
devices (``jax_num_cpu_devices``), so the numbers are XLA:CPU's buffer assignment
for the per-device SPMD program (with its memory-minimising scheduler); a TPU or
GPU compile fuses and schedules differently, so treat them as an estimate and
re-run on the target (``--platform default``) to confirm.

    python -m star_haiku_xmap.plan --mesh 1x8              # TPU v3-8 (16 GiB per core), the paper's step
    python -m star_haiku_xmap.plan --mesh 8x1 --zero 1 --device-gib 80
    python -m star_haiku_xmap.plan --mesh 1x1 --device-gib 80 --opt-state-dtype bfloat16
    star-engine plan --standard                                             # the table of docs/gptj6b.md
    star-engine plan --models all                                           # the table of docs/models.md (Llama family)
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
import json
from pathlib import Path
from typing import Any

from star_engine import UserError
from star_engine.helpers import run_command

from ..model.config import MAX_LAYERS, PRESETS, preset
from .models import add_arguments as add_model_arguments, run_models
from .table import GIB, short, yes

STANDARD = (  # (mesh, zero, master, moments, grad accumulator, remat, device GiB, micro-batch, grad accum)
    ("1x8", 0, "float32", "mixed", "bfloat16", False, 16.0, 1, 8),  # the paper files: mixed moments, bf16 accum
    ("1x8", 0, "float32", "bfloat16", "float32", False, 16.0, 1, 8),  # the paper's step (8 x 1537-token chunks)
    ("1x8", 0, "float32", "bfloat16", "bfloat16", False, 16.0, 1, 8),  # ... with a bf16 gradient accumulator
    ("1x8", 0, "float32", "float32", "bfloat16", False, 16.0, 1, 8),  # ... and fp32 moments: the original's
    ("1x8", 0, "float32", "float32", "bfloat16", True, 16.0, 1, 8),  # ... with per-layer remat, as the original
    ("1x8", 0, "float32", "float32", "float32", True, 16.0, 1, 8),
    ("1x8", 0, "bfloat16", "bfloat16", "float32", False, 16.0, 1, 8),  # bf16 weights (small updates lost)
    ("8x1", 1, "float32", "float32", "float32", False, 80.0, 8, 8),
    ("8x1", 1, "float32", "bfloat16", "bfloat16", True, 80.0, 8, 8),
    ("1x1", 0, "float32", "bfloat16", "bfloat16", True, 80.0, 1, 8),
)


DEFAULTS = {"preset": "gptj-6b", "dtype": "bfloat16", "mesh": "1x8", "zero": 0, "opt_state_dtype": "mixed",
            "master_dtype": "float32", "grad_accum_dtype": "float32", "batch": 1, "grad_accum": 8, "seq_len": 1536,
            "gen_batch": 8, "prompt_len": 1536, "new_tokens": 96}
"""The shape options' values without an experiment file (with one, the experiment decides them)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.split("\n\n")[0].replace("\n", " ")
    parser.add_argument("experiment", type=Path, nargs="?", default=None,
                        help="an experiment TOML file: plan what it will run (its model, mesh, dtypes, [training] "
                             "batch x grad_accum x seq_len and [generation] sizes; plan/experiment.py); the shape "
                             "options below then come from it")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="with an experiment file: override one of its keys, as run --set does")
    parser.add_argument("--preset", default=None, help="model preset (default gptj-6b)")
    parser.add_argument("--n-layer", type=int, default=None, help="override the preset's layer count")
    parser.add_argument("--dtype", default=None, choices=("bfloat16", "float32"), help="parameter dtype (default "
                                                                                         "bfloat16)")
    parser.add_argument("--mesh", default=None, help="DPxMP, e.g. 1x8 (default), 8x1, 2x4")
    parser.add_argument("--zero", type=int, default=None, choices=(0, 1),
                        help="1: ZeRO-1 optimizer state over dp (default 0)")
    parser.add_argument("--opt-state-dtype", default=None, choices=("float32", "bfloat16", "mixed"),
                        help="Adam moments' dtype (model.opt_state_dtype; mixed: first moment bf16, second fp32; "
                             "default: the GPT-J experiments' mixed)")
    parser.add_argument("--master-dtype", default=None, choices=("float32", "bfloat16"),
                        help="dtype of the trained weights (model.master_dtype; default fp32 masters)")
    parser.add_argument("--grad-accum-dtype", default=None, choices=("float32", "bfloat16"),
                        help="gradient accumulator's dtype (model.grad_accum_dtype; default float32)")
    parser.add_argument("--remat", action="store_true", help="per-layer rematerialisation (model.remat)")
    parser.add_argument("--batch", type=int, default=None,
                        help="sequences per micro-batch (training.batch_size; default: the paper's 1)")
    parser.add_argument("--grad-accum", type=int, default=None,
                        help="micro-batches per step (training.grad_accum; default: the paper's 8)")
    parser.add_argument("--seq-len", type=int, default=None, help="training sequence length (default 1536)")
    parser.add_argument("--gen-batch", type=int, default=None, help="sampling batch (generation.batch_size; "
                                                                     "default 8)")
    parser.add_argument("--prompt-len", type=int, default=None, help="sampling prompt length (default 1536)")
    parser.add_argument("--new-tokens", type=int, default=None, help="tokens generated per prompt (default 96)")
    parser.add_argument("--what", default="train,sample",
                        help="comma-separated: train, sample; with an experiment file also base (the "
                             "[base_training] step) and verifier (the [verifier]'s DPO step)")
    parser.add_argument("--device-gib", type=float, default=16.0, help="memory per device to check against")
    parser.add_argument("--platform", default="cpu", choices=("cpu", "default"),
                        help="cpu: simulated host devices (default); default: the machine's accelerators")
    parser.add_argument("--standard", action="store_true",
                        help="run the table of docs/gptj6b.md (the paper's step on 1x8 / 16 GiB with master, moment and "
                             "accumulator dtypes and remat varied; 8x1 with ZeRO-1 and 1x1 on 80 GiB)")
    parser.add_argument("--json", action="store_true", help="one JSON object per compiled program")
    add_model_arguments(parser)



def _check_args(args: argparse.Namespace):
    """The model config and the jobs' shapes, refused (UserError naming the option) before
    anything is compiled."""
    if args.preset not in PRESETS:
        raise UserError(f"--preset: unknown preset {args.preset!r}; known: {', '.join(sorted(PRESETS))}")
    for flag, value, minimum in (("--n-layer", args.n_layer, 1), ("--batch", args.batch, 1),
                                 ("--grad-accum", args.grad_accum, 1), ("--seq-len", args.seq_len, 2),
                                 ("--gen-batch", args.gen_batch, 1), ("--prompt-len", args.prompt_len, 1),
                                 ("--new-tokens", args.new_tokens, 1)):
        if value is not None and value < minimum:
            raise UserError(f"{flag}: must be >= {minimum}, got {value}")
    if args.n_layer is not None and args.n_layer > MAX_LAYERS:
        raise UserError(f"--n-layer: at most {MAX_LAYERS}, got {args.n_layer}")
    if not args.device_gib > 0 or args.device_gib == float("inf"):
        raise UserError(f"--device-gib: must be a positive number, got {args.device_gib}")
    what = tuple(w.strip() for w in args.what.split(",") if w.strip())
    if set(what) & {"base", "verifier"}:
        raise UserError(f"--what: base and verifier are an experiment's steps: plan EXPERIMENT.toml --what "
                        f"{args.what}")
    if not what or set(what) - {"train", "sample"}:
        raise UserError(f"--what: a comma-separated list of train, sample; got {args.what!r}")
    config = preset(args.preset, n_layer=args.n_layer, dtype=args.dtype)
    if "train" in what and args.seq_len > config.n_ctx:
        raise UserError(f"--seq-len: {args.seq_len} is more than the model's context n_ctx = {config.n_ctx}")
    if "sample" in what and args.prompt_len + args.new_tokens > config.n_ctx:
        raise UserError(f"--prompt-len + --new-tokens: {args.prompt_len + args.new_tokens} is more than the model's "
                        f"context n_ctx = {config.n_ctx}")
    return config, what

def _row(r: dict, device_gib: float) -> str:
    g = lambda b: f"{b / GIB:.2f}"
    fits = "yes" if r["peak"] <= device_gib * GIB else "NO"
    return (f"| {r['mesh']} | {r['program']} | {r['zero']} | {short(r['master_dtype'])} | "
            f"{short(r['opt_state_dtype'])} | {short(r['accum_dtype'])} | {yes(r['remat'])} | {r['shape']} | "
            f"{g(r['argument'])} | {g(r['output'] - r['alias'])} | {g(r['temp'])} | {g(r['peak'])} | "
            f"{device_gib:g} | {fits} | {r['compile_s']} |")


HEADER = ("| mesh dp x mp | program | ZeRO | master | moments | grad accum | remat | shape | arguments GiB | "
          "outputs (not aliased) GiB | temporaries GiB | peak GiB | device GiB | fits | compile s |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")


def run(args: argparse.Namespace) -> int:
    from . import memory  # jax: this module loads with the CLI (the plan's options); jax when a plan runs

    if getattr(args, "experiment", None) is not None:
        return _run_experiment(args)
    if getattr(args, "overrides", None):
        raise UserError("--set: only with an experiment file (star-engine plan EXPERIMENT.toml --set KEY=VALUE)")
    for key, value in DEFAULTS.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    config, what = _check_args(args)
    if getattr(args, "models", None):
        return run_models(args)
    if args.standard:
        jobs: list[tuple[Any, ...]] = [(memory.parse_mesh(m), *rest) for m, *rest in STANDARD]
    else:
        jobs = [(memory.parse_mesh(args.mesh), args.zero, args.master_dtype, args.opt_state_dtype, args.grad_accum_dtype,
                 args.remat, args.device_gib, args.batch, args.grad_accum)]
    memory.setup_devices(max(dp * mp for (dp, mp), *_ in jobs), args.platform)
    if not args.json:
        print(f"# {args.preset}: {config.n_layer} layers, d_model {config.d_model}, {config.dtype}; "
              f"{memory.devices_line()}")
        print(HEADER)
    done_sample = set()
    for (dp, mp), zero, master, opt_dtype, accum, remat, gib, batch, grad_accum in jobs:
        todo = tuple(w for w in what if w != "sample" or (dp, mp) not in done_sample)
        if "sample" in todo:
            done_sample.add((dp, mp))
        with _compiling(todo, dp, mp):
            rows = memory.plan_one(config=config, dp=dp, mp=mp, zero=zero, opt_state_dtype=opt_dtype, batch=batch,
                            grad_accum=grad_accum, seq_len=args.seq_len, gen_batch=args.gen_batch,
                            prompt_len=args.prompt_len, new_tokens=args.new_tokens, what=todo,
                            master_dtype=master, accum_dtype=accum, remat=remat)
        for r in rows:
            if args.json:
                print(json.dumps({**r, "device_gib": gib, "fits": r["peak"] <= gib * GIB}), flush=True)
            else:
                print(_row(r, gib), flush=True)
    return 0


@contextlib.contextmanager
def _compiling(what: tuple[str, ...], dp: int, mp: int) -> Iterator[None]:
    """A line on stderr before XLA compiles a program (seconds for a small model, minutes for
    a 6B one: ``plan`` printed nothing for 141 s, issue #43); the table's row gives the time."""
    print(f"# compiling the {' and '.join(what)} program{'s' if len(what) > 1 else ''} for a dp={dp} mp={mp} "
          f"mesh (XLA; minutes for a model of billions of parameters) ...", file=sys.stderr, flush=True)
    yield


def _run_experiment(args: argparse.Namespace) -> int:
    """``plan EXPERIMENT``: the experiment's train steps and sampler (``experiment.py``)."""
    from . import experiment, memory  # jax (haiku, via lora), as run

    what = tuple(w.strip() for w in args.what.split(",") if w.strip())
    if not what or set(what) - {*experiment.SECTIONS, "sample"}:
        raise UserError(f"--what: a comma-separated list of {', '.join(experiment.SECTIONS)}, sample; got {args.what!r}")
    if not args.device_gib > 0 or args.device_gib == float("inf"):
        raise UserError(f"--device-gib: must be a positive number, got {args.device_gib}")
    cfg = experiment.load(args)
    trains = [w for w in what if w in experiment.SECTIONS]
    jobs = [experiment.job(args, w, cfg) for w in trains or ["train"]]  # every program refused before any compiles
    config, kw, _ = jobs[0]
    memory.setup_devices(kw["dp"] * kw["mp"], args.platform)
    if not args.json:
        for _, _, line in jobs:
            print(line)
        for w in experiment.unplanned(cfg, what):
            print(f"# the experiment also runs the {experiment.SECTIONS[w].label or '[training]'} step: plan it with --what {w}")
        print(HEADER)
    programs = [(kw, ("train",)) for _, kw, _ in jobs] if trains else []
    programs += [(kw, ("sample",))] if "sample" in what else []
    for kw, todo in programs:
        with _compiling(todo, kw["dp"], kw["mp"]):
            rows = memory.plan_one(config=config, what=todo, **kw)
        for r in rows:
            if args.json:
                print(json.dumps({**r, "device_gib": args.device_gib, "fits": r["peak"] <= args.device_gib * GIB}),
                      flush=True)
            else:
                print(_row(r, args.device_gib), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m star_haiku_xmap.plan")
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run_command(lambda: run(args))  # the same failure rules as star-engine plan

