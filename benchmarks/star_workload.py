"""One STaR iteration's generation and fine-tuning, replayed on two length mixes,
against HF transformers in the same rounds. Prints ONE JSON line.

Mixes:

- ``addition``: experiments/addition.toml's model and task (``star_arithmetic``
  with its options): one iteration's train questions (``n_train_samples``: 700
  since 2026-11-29, 1,000 before; generate), every second one hinted
  (rationalize) and the 250 dev questions (evaluate), each with a token budget of
  its gold completion's length; training on 500 of those examples (half hinted)
  at the file's batch size (8 since 2026-11-29, 16 before).
- ``cqa``: CommonsenseQA-shaped: few-shot prompts of ~600 tokens (a shared
  prefix and a 25-70-token question), rationales of 30-120 tokens; the 4-layer
  d256 model of gptj_throughput.py with GPT-J's vocabulary of 50,400; training
  on question + rationale.

The weights are random, so every side is forced to the same lengths: each
request's budget is its target length and end-of-text never ends a row (ours:
no end-of-text id; HF: ``min_new_tokens`` and no ``eos_token_id``). Greedy.

Generation sides: this engine (continuous batching, a prompt prefix shared by
every request prefilled once), the same without prefix sharing
(``model.share_prefix = false``), its static path (``model.generation = "static"``), HF ``generate`` on length-sorted static
batches of the same size (each batch runs to its longest budget) and, when the
installed transformers gives GPT-J the same tokens through continuous batching
(``generate_batch``), that too; with ``--decode-attention ragged`` the engine's continuous sides
decode with the ragged kernel (``model.decode_attention``) and ``engine_dense`` is the dense one
in the same rounds. Training sides: this engine's packed step
(``packing = "segments"``) and its padded path (``"none"``), and a plain torch
AdamW loop on the padded plan's batches (right-padded to each batch's longest)
and padding-free (the packed plan's batches flattened into one row with
restarting ``position_ids``, which HF turns into a block-diagonal mask).

``--only gen`` (``train``) times generation (training) alone; ``--skip`` leaves sides out.

Useful tokens: generated tokens within each request's budget; for training,
the real (non-padding) tokens of the steps. Every side runs its whole workload
once per round, the order rotating between rounds; ratios are medians of the
per-round ratios (wall time; ``_cpu``: CPU time). Same thread count everywhere.

    python benchmarks/star_workload.py --peer
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import tempfile
import tomllib
from collections.abc import Callable
from pathlib import Path

from bench_common import (MALLOC_HELP, MALLOC_MODES, Peer, apply_malloc, choose_peers, cpu_name, logged, paired_ratio,
                          rotate, summarise, thp_mode, threads, timed)

ROOT = Path(__file__).resolve().parents[1]
ADDITION_TOML = ROOT / "experiments" / "addition.toml"
GEN_SIDES = ("engine", "engine_no_prefix", "engine_static", "engine_dense", "hf_static", "hf_continuous")
TRAIN_SIDES = ("engine_packed", "engine_padded", "hf_padded", "hf_packed", "engine_packed_plain_loss",
               "engine_packed_chunked_loss")


def mesh_arg(text: str, remaining: bool = True) -> tuple[int, int]:
    """``DPxMP`` as (dp, mp); dp ``-1`` (the remaining devices) only where ``remaining``
    (``model.mesh``: yes; ``model.train_mesh``: both sizes given, as the backend requires)."""
    try:
        dp, mp = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not DPxMP (e.g. 1x2)") from None
    if mp < 1 or dp == 0 or dp < (-1 if remaining else 1):
        raise argparse.ArgumentTypeError(f"{text!r}: dp must be {'-1 or ' if remaining else ''}>= 1 and mp >= 1")
    return dp, mp


def train_dp(a: argparse.Namespace, devices: int) -> int:
    """The dp size of the training sides' mesh (what a training plan's rows are a multiple of)."""
    if a.train_mesh is not None:
        return a.train_mesh[0]
    dp, mp = a.mesh
    return dp if dp > 0 else max(devices // mp, 1)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mixes", default="addition,cqa", help="comma-separated: addition, cqa")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip", default="", help="comma-separated sides left out, e.g. hf_continuous,engine_no_prefix")
    ap.add_argument("--train-steps", type=int, default=24, help="optimizer steps per training call")
    ap.add_argument("--addition-requests", type=int, default=0, help="an even sample of N (0: all 1,750)")
    ap.add_argument("--cqa-requests", type=int, default=64)
    ap.add_argument("--cqa-prompt", type=int, default=600, help="mean prompt tokens")
    ap.add_argument("--cqa-vocab", type=int, default=50400)
    ap.add_argument("--cqa-slots", type=int, default=16, help="generation batch size (slots) of the cqa mix")
    ap.add_argument("--cqa-train-batch", type=int, default=8)
    ap.add_argument("--chunk", type=int, default=16, help="model.generation_chunk")
    ap.add_argument("--decode-attention", choices=("dense", "ragged"), default="dense",
                    help="model.decode_attention of the engine's continuous sides (ragged: also an engine_dense side)")
    ap.add_argument("--layers", type=int, default=None, help="override both mixes' n_layer (smoke tests)")
    ap.add_argument("--cpu-devices", type=int, default=None, help="model.cpu_devices (default: the backend's)")
    ap.add_argument("--mesh", type=mesh_arg, default=(-1, 1), metavar="DPxMP",
                    help="model.mesh of the engine's sides, e.g. 1x2 (default: -1x1, every device on dp; write --mesh=-1x2)")
    ap.add_argument("--train-mesh", type=functools.partial(mesh_arg, remaining=False), default=None, metavar="DPxMP",
                    help="model.train_mesh: the engine's training sides on the first dp x mp devices (default: the "
                         "run's mesh, as the backend)")
    ap.add_argument("--train-devices", type=int, default=None, help="--train-mesh Nx1")
    ap.add_argument("--peer", action="store_true", help="also time HF transformers in a child process")
    ap.add_argument("--only", choices=("all", "gen", "train"), default="all", help="time generation or training only")
    ap.add_argument("--loss-chunk", type=int, default=None,
                    help="model.loss_chunk of the engine's training sides (default: the backend's, the plain path)")
    ap.add_argument("--loss-tokens", type=int, default=None,
                    help="model.loss_tokens of the engine's training sides (the output layer over token chunks with "
                         "its gradients in the forward pass; default: the backend's, off)")
    ap.add_argument("--plain-loss-side", action="store_true",
                    help="also time the packed step with model.loss_chunk = 0 and loss_tokens unset (full logits: "
                         "the plain path) in the same rounds")
    ap.add_argument("--chunked-loss-side", type=int, default=None, metavar="CHUNK",
                    help="also time the packed step with model.loss_chunk = CHUNK and loss_tokens unset (vocabulary "
                         "chunks) in the same rounds")
    ap.add_argument("--malloc", choices=MALLOC_MODES, default="default", help=MALLOC_HELP)
    ap.add_argument("--hf-omp-wait-policy", choices=("auto", "default", "passive"), default="auto")
    ap.add_argument("--hf-serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--workload", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.train_devices is not None:
        if a.train_mesh is not None:
            ap.error("--train-devices N is --train-mesh Nx1: give one of them")
        if a.train_devices < 1:
            ap.error(f"--train-devices: {a.train_devices} is not >= 1")
        a.train_mesh = (a.train_devices, 1)
    return a


# ----------------------------------------------------------------------------- mixes


def _model(cfg: dict) -> dict:
    keys = ("n_layer", "d_model", "n_head", "d_head", "d_ff", "rotary_dim", "n_ctx", "vocab")
    return {k: int(cfg[k]) for k in keys}


def addition_mix(a) -> dict:
    """Prompts, budgets and training examples of one iteration of experiments/addition.toml."""
    from star_arithmetic import AdditionTask, TargetHint

    toml = tomllib.loads(ADDITION_TOML.read_text())
    task = AdditionTask(**toml["task"]["options"])
    hint = TargetHint()
    gen = toml["generation"]
    train = task.load("train", None)[:gen["n_train_samples"]]
    dev = task.load("dev", None)
    enc = lambda text: list(text.encode("utf-8"))  # the byte tokenizer; end-of-text is 256
    gold = lambda e: enc(task.gold_completion(e, direct=False))
    pairs = ([(enc(task.context(e)), gold(e)) for e in train]  # generate
             + [(enc(hint.context(task, e)), gold(e)) for e in train[::2]]  # rationalize (about half)
             + [(enc(task.context(e)), gold(e)) for e in dev])  # evaluate
    if a.addition_requests:  # an even sample of the three stages
        pairs = [pairs[i * len(pairs) // a.addition_requests] for i in range(min(a.addition_requests, len(pairs)))]
    m = toml["model"]
    model = {"n_layer": 4, "d_model": 128, "n_head": 4, "d_head": 32, "d_ff": 512, "rotary_dim": 16, "n_ctx": 512,
             "vocab": 264}  # the tiny preset, then the file's overrides
    model.update({k: m[k] for k in model if k in m})
    kept = [(enc(task.context(e)), gold(e)) for e in train[:250]] + \
           [(enc(hint.context(task, e)), gold(e)) for e in train[250:500]]
    return {"model": _model(model), "eos": 256, "pad": 256, "slots": gen["batch_size"],
            "prompts": [p for p, _ in pairs],
            "budgets": [len(c) for _, c in pairs], "train": [[p, c] for p, c in kept],
            "train_batch": toml["training"]["batch_size"]}


def cqa_mix(a) -> dict:
    """Few-shot prompts of ~a.cqa_prompt tokens (a shared prefix + a 25-70-token
    question) with 30-120-token rationales, random ids of a BPE-sized vocabulary."""
    import numpy as np

    rng = np.random.default_rng(0)
    V = a.cqa_vocab
    ids = lambda n: rng.integers(0, V - 1, n).tolist()
    prefix = ids(max(1, a.cqa_prompt - 47))
    questions = [ids(int(rng.integers(25, 71))) for _ in range(a.cqa_requests)]
    rationales = [int(rng.integers(30, 121)) for _ in range(a.cqa_requests)]
    n_ctx = 1 << (a.cqa_prompt + 200).bit_length()
    return {"model": {"n_layer": 4, "d_model": 256, "n_head": 8, "d_head": 32, "d_ff": 1024, "rotary_dim": 16,
                      "n_ctx": n_ctx, "vocab": V},
            "eos": V - 1, "pad": V - 1, "slots": a.cqa_slots,
            "prompts": [prefix + q for q in questions], "budgets": rationales,
            "train": [[q, ids(r)] for q, r in zip(questions, rationales)], "train_batch": a.cqa_train_batch}


def workload(a, dp: int) -> dict:
    """The mixes with their training plans: the example indices of every step of
    the padded plan and of the packed plan (what each side trains on)."""
    from star_haiku_xmap.train import packplan
    from star_haiku_xmap.train import trainer as train
    from star_haiku_xmap.model.config import GPTJConfig

    out = {}
    for name in a.mixes.split(","):
        mix = {"addition": addition_mix, "cqa": cqa_mix}[name](a)
        if a.layers:
            mix["model"]["n_layer"] = a.layers
        lengths = [len(p) + len(c) + 1 for p, c in mix["train"]]
        seq_len = mix["model"]["n_ctx"]
        padded = packplan.plan_steps(lengths, steps=a.train_steps, per_step=mix["train_batch"], seed=0)
        packed = packplan.plan_packed(lengths, steps=a.train_steps, batch_size=mix["train_batch"], grad_accum=1,
                                      seed=0, seq_len=seq_len, dp=dp,
                                      dims=train.dims(GPTJConfig(**mix["model"])))
        mix["plans"] = {"none": [list(map(int, s)) for s in padded], "segments": [list(map(int, s.idx)) for s in packed]}
        out[name] = mix
    return out


def useful_train_tokens(mix: dict, plan: str) -> int:
    return sum(len(mix["train"][i][0]) + len(mix["train"][i][1]) + 1 for s in mix["plans"][plan] for i in s)


# ----------------------------------------------------------------------------- this engine


def engine_sides(a, mixes: dict) -> tuple[dict, dict]:
    """({(mix, side): fn}, info) for this engine, every fn compiled by a first call."""
    from star_haiku_xmap.session.machine import default_cpu_devices, set_cpu_devices

    n = a.cpu_devices or default_cpu_devices()
    set_cpu_devices(n)  # before jax starts its backends
    import jax
    import jax.numpy as jnp
    import numpy as np

    from star_haiku_xmap.model import network as model
    from star_haiku_xmap.train import packing
    from star_haiku_xmap.runtime import sharding
    from star_haiku_xmap.train import trainer as train
    from star_haiku_xmap.sampling import continuous, static as sample
    from star_haiku_xmap.model.config import GPTJConfig
    from star_haiku_xmap.options import AdamW
    from star_haiku_xmap.session.machine import train_mesh
    mesh = sharding.make_mesh({"dp": a.mesh[0], "mp": a.mesh[1]})
    tmesh = train_mesh(mesh, None if a.train_mesh is None else dict(zip(("dp", "mp"), a.train_mesh)))
    info = {"mesh": dict(mesh.shape), "train_mesh": dict(tmesh.shape), "jax": jax.__version__, "cpu_devices": n}
    fns: dict[tuple[str, str], Callable[[], None]] = {}  # (mix, side) -> one timed call
    for name, mix in mixes.items():
        cfg = GPTJConfig(**mix["model"])
        params = sharding.shard_tree(model.init_params(cfg, 0), mesh)
        decode = sample.DecodeConfig(temperature=0.0, top_p=1.0, eos_id=-1, pad_id=mix["pad"], slots=mix["slots"],
                                     chunk=a.chunk, attention=a.decode_attention)
        common = dict(config=cfg, mesh=mesh)
        args = (params, mix["prompts"], list(range(len(mix["prompts"]))), mix["budgets"])
        stats: dict = {}

        def cont(args=args, common=common, decode=decode, stats=stats, share=True):
            out = continuous.generate(*args, decode=dataclasses.replace(decode, share_prefix=share), stats=stats,
                                      **common)
            assert [len(t) for t in out] == args[3]

        def static(args=args, common=common, decode=decode):
            out = sample.generate_batches(*args, decode=decode, **common)
            assert [len(t) for t in out] == args[3]

        if a.only != "train":
            fns[name, "engine"], fns[name, "engine_static"] = cont, static
            if continuous.shared_prefix(mix["prompts"]):
                fns[name, "engine_no_prefix"] = functools.partial(cont, stats={}, share=False)
            if a.decode_attention != "dense":  # the same side with the dense decode attention
                fns[name, "engine_dense"] = functools.partial(cont, decode=dataclasses.replace(decode, attention="dense"),
                                                              stats={})
            info[f"{name}_engine_stats"] = stats
        if a.only == "gen":
            continue
        encoded = [packing.Encoded(np.asarray(p + c + [mix["eos"]], np.int32), len(p)) for p, c in mix["train"]]
        train_sides: list[tuple[str, str, int | None, int | None]] = [
            ("engine_packed", "segments", a.loss_chunk, a.loss_tokens),
            ("engine_padded", "none", a.loss_chunk, a.loss_tokens)]
        if a.plain_loss_side:
            train_sides.append(("engine_packed_plain_loss", "segments", 0, None))
        if a.chunked_loss_side:
            train_sides.append(("engine_packed_chunked_loss", "segments", a.chunked_loss_side, None))
        for side, pack, loss_chunk, loss_tokens in train_sides:
            if side in a.skip.split(","):
                continue
            batches = list(train.packing_batches(encoded, config=cfg, steps=a.train_steps,
                                                 batch_size=mix["train_batch"], grad_accum=1, seed=0,
                                                 seq_len=cfg.n_ctx, pad_id=mix["pad"], dp=sharding.dp_size(tmesh),
                                                 packing=pack))
            tx = AdamW.from_table({"lr": 1e-4, "warmup_steps": 0}).build(10_000)
            tparams = params if tmesh is mesh else sharding.shard_tree(params, tmesh)
            box = [train.init_state(jax.tree.map(jnp.copy, tparams), tx)]
            update = train.make_update(cfg, tx, tmesh, box[0], loss_chunk=loss_chunk, loss_tokens=loss_tokens)
            put = lambda b: jax.device_put(b, sharding.batch_sharding(tmesh, batch_axis=1, ndim=3))

            def steps(box=box, update=update, batches=batches, put=put):
                box[0], losses, _ = train.run_steps(update, box[0], map(put, batches), mesh=tmesh)
                jax.block_until_ready(losses)

            fns[name, side] = steps
    compile_s = {f"{m}_{s}_first_call_s": round(logged(f"{m} {s} (first call)", lambda fn=fn: timed(fn))()[0], 2)
                 for (m, s), fn in fns.items()}
    return fns, {**info, **compile_s}


# ----------------------------------------------------------------------------- main


def main(argv=None) -> None:
    a = parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    apply_malloc(a.malloc, __file__, argv)
    if a.hf_serve:
        import hf_workload

        hf_workload.serve_workload(json.loads(Path(a.workload).read_text()), a)
        return
    from star_haiku_xmap.session.machine import default_cpu_devices

    devices = a.cpu_devices or default_cpu_devices()
    dp = train_dp(a, devices)  # the training plans' row multiple
    mixes = workload(a, dp)
    result = {"threads": threads(), "cpu": cpu_name(), "malloc": a.malloc, "thp": thp_mode(),
              "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""), "loadavg_start": round(os.getloadavg()[0], 2),
              "rounds": a.rounds, "train_steps": a.train_steps, "chunk": a.chunk}
    peers = None
    if a.peer:  # started first: their import and warm-up must not overlap our timings
        tmp = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        json.dump(mixes, tmp)
        tmp.close()
        policies = {"auto": ("default", "passive")}.get(a.hf_omp_wait_policy, (a.hf_omp_wait_policy,))
        child_argv = [x for x in argv if x != "--peer"] + ["--workload", tmp.name]
        started = [Peer(__file__, child_argv, p).ready() for p in policies]
        first = next(iter(mixes))
        peers = choose_peers(started, (f"padded:{first}",))[f"padded:{first}"]
        result.update(peers.ask("info"))
        result["hf_omp_wait_policy"] = peers.wait_policy
    fns, info = engine_sides(a, mixes)
    result.update(info)
    for name, mix in mixes.items():
        for kind, sides, tokens in (("gen", GEN_SIDES, {s: sum(mix["budgets"]) for s in GEN_SIDES}),
                                    ("train", TRAIN_SIDES, {s: useful_train_tokens(mix, "segments" if "packed" in s
                                                                                   else "none") for s in TRAIN_SIDES})):
            if a.only not in ("all", kind):
                continue
            skip = set(a.skip.split(","))
            calls = {s: fns[name, s] for s in sides if (name, s) in fns and s not in skip}
            calls = {s: (lambda fn=fn: timed(fn)) for s, fn in calls.items()}
            if peers is not None:
                for s in sides:
                    if s.startswith("hf_") and s not in skip and (s != "hf_continuous"
                                                                  or result[f"hf_{name}_continuous_supported"]):
                        calls[s] = lambda cmd=f"{s[3:]}:{name}": tuple(peers.ask(cmd)[k] for k in ("s", "cpu"))
            times = dict(zip(calls, rotate([logged(f"{name} {s}", fn) for s, fn in calls.items()], a.rounds)))
            result[f"{name}_{kind}_useful_tokens"] = tokens[sides[0]]
            for s, t in times.items():
                result[f"{name}_{kind}_{s}_tokens_per_s"] = summarise("x", t, tokens[s])["x_tokens_per_s"]
            base = sides[0]
            for s in times:
                if s != base:  # per-round paired ratios, normalised by each side's useful tokens
                    scale = tokens[base] / tokens[s]
                    for idx, suffix in ((0, ""), (1, "_cpu")):
                        r = paired_ratio(times[base], times[s], idx) * scale
                        result[f"{name}_{kind}_{base}_over_{s}{suffix}"] = round(r, 2)
    if peers is not None:
        peers.close()
        os.unlink(tmp.name)
    result["loadavg_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
