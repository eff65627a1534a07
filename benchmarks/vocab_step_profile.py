"""Where the large-vocabulary training step spends its time, part by part, this
engine's plain (full logits), chunked (``[model] loss_chunk``) and fused (``[model]
loss_tokens``: token chunks, gradients in the forward pass) loss paths against HF GPT-J
(torch, CPU) at the same shape. Prints a table, then ONE JSON line.

The shape is star_workload.py's CQA-shaped packed step: 4 layers x d256, GPT-J's
vocabulary of 50,400, R rows of T tokens (default 4 x 320, the packed plan's rows).
Each side times the same sub-programs, every one a separate call (jit'd here):

- ``body_fwd``: tokens -> final hidden states (after the final LayerNorm);
- ``head_fwd``: hidden states -> output projection -> log p(target), summed;
- ``head_fwd_bwd``: the same with its gradients (hidden states, weight, bias);
  ``head_bwd`` = the difference;
- ``body_fwd_bwd``: the body's forward and backward (a fixed cotangent on the
  hidden states), ``body_bwd`` = the difference;
- ``optimizer``: clip + AdamW on the whole parameter tree;
- ``step``: the whole training step (this engine's ``make_update`` on the
  benchmark's dp mesh; HF's forward with labels, backward, clip, AdamW).

Engine head and step parts come three times, plain, chunked and fused. HF's step also
runs once under ``torch.profiler`` (its top operators by self CPU time are printed).
``--ops``: each engine step also runs under XLA's profiler (``xla_ops.py``), and its
top ops and the time per part of the step (head, forward, backward, collectives,
optimizer) are printed and kept in the JSON line. Sides run in interleaved rounds
(``bench_common.rotate``; HF in a child process); ratios are medians of per-round
ratios. The table names the CPU and the load average. ``--cpu-devices 1``: the engine on
one XLA:CPU device (what ``[model] train_mesh = {dp = 1, mp = 1}`` trains on).

    python benchmarks/vocab_step_profile.py --rounds 3 --ops
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
from types import SimpleNamespace
from typing import Any, cast

from bench_common import Peer, cpu_name, logged, paired_ratio, rotate, serve, threads, timed, timed_reply

PARTS = ("body_fwd", "body_fwd_bwd", "head_fwd", "head_fwd_bwd", "optimizer", "step")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--seq", type=int, default=320)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=50400)
    ap.add_argument("--chunk", type=int, default=None, help="loss_chunk of the chunked side (default: chunked_ce.DEFAULT_CHUNK, 4096)")
    ap.add_argument("--tokens", type=int, default=0, help="loss_tokens of the fused side (default 0: fused_ce's budget)")
    ap.add_argument("--cpu-devices", type=int, default=None, help="XLA:CPU devices of the engine (default: one per core)")
    ap.add_argument("--ops", action="store_true", help="XLA's per-op profile of each engine step (xla_ops.py)")
    ap.add_argument("--dot-dtype", default=None, help="chunked_ce's dot_dtype for an extra head side (bfloat16)")
    ap.add_argument("--no-peer", action="store_true", help="engine parts only")
    ap.add_argument("--torch-serve", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def _shape(a) -> dict:
    return {"n_layer": a.layers, "d_model": a.d_model, "n_head": a.d_model // 32, "d_head": 32,
            "d_ff": 4 * a.d_model, "rotary_dim": 16, "n_ctx": 1024, "vocab": a.vocab}


# ----------------------------------------------------------------------------- engine


def engine_parts(a) -> tuple[dict, dict]:
    """({part: fn}, info): every fn one call of a jit'd sub-program, compiled by a first call."""
    from star_haiku_xmap.session.machine import default_cpu_devices, set_cpu_devices

    set_cpu_devices(a.cpu_devices or default_cpu_devices())
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from star_haiku_xmap.model import network as model
    from star_haiku_xmap.model.config import GPTJConfig
    from star_haiku_xmap.options import AdamW
    from star_haiku_xmap.runtime import sharding
    from star_haiku_xmap.train import chunked_ce, fused_ce
    from star_haiku_xmap.train import trainer as train

    cfg = GPTJConfig(**_shape(a))
    chunk = chunked_ce.chunk_for(a.chunk) or chunked_ce.DEFAULT_CHUNK
    mesh = sharding.make_mesh({"dp": -1, "mp": 1})
    rows = sharding.batch_sharding(mesh, batch_axis=0, ndim=2)
    params = sharding.shard_tree(model.init_params(cfg, 0), mesh)
    rng = np.random.default_rng(0)
    R, T = a.rows, a.seq
    tokens = rng.integers(0, cfg.vocab, (R, T)).astype(np.int32)
    batch = {"tokens": tokens, "targets": np.roll(tokens, -1, axis=1), "weights": np.ones((R, T), np.float32),
             "segments": np.ones((R, T), np.int32), "positions": np.broadcast_to(np.arange(T, dtype=np.int32), (R, T))}
    batch = {k: jax.device_put(np.ascontiguousarray(v), rows) for k, v in batch.items()}
    hidden = jax.jit(lambda p, b: model.apply_forward(p, b["tokens"], cfg, b["positions"], segments=b["segments"],
                                                      head=False))
    h_BTD = hidden(params, batch)
    ct_BTD = jax.device_put(jnp.asarray(rng.standard_normal(h_BTD.shape), jnp.float32), h_BTD.sharding)
    head = {k: params["lm_head"][k] for k in ("w", "b")}

    fused_tokens = fused_ce.tokens_for(a.tokens, cfg.vocab)

    def head_loss(kind, dot_dtype=None):
        def f(hd, h, b):
            if kind == "plain":
                logits = (h @ hd["w"] + hd["b"]).astype(jnp.float32)
                return jnp.sum(train.logits_logp(logits, b["targets"]))
            if kind == "fused":
                return fused_ce.weighted_logp_sum(h, hd["w"], hd["b"], b["targets"], b["weights"], tokens=fused_tokens,
                                                  dot_dtype=dot_dtype)
            B, T_, D = h.shape
            return jnp.sum(chunked_ce.chunked_logp(h.reshape(B * T_, D), hd["w"], hd["b"], b["targets"].reshape(-1),
                                                   chunk=chunk, dot_dtype=dot_dtype))
        return f

    tx = AdamW.from_table({"lr": 1e-4, "warmup_steps": 0}).build(10_000)
    opt_state = tx.init(params)

    def opt(p, s, g):
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    body_vjp = jax.jit(lambda p, b: jax.vjp(lambda q: hidden(q, b), p)[1](ct_BTD))
    fns = {"body_fwd": lambda: hidden(params, batch),
           "body_fwd_bwd": lambda: body_vjp(params, batch),
           "optimizer": functools.partial(jax.jit(opt), params, opt_state, params)}
    kinds = [("plain", None), ("chunked", None), ("fused", None)] + (
        [(f"chunked_{a.dot_dtype}", a.dot_dtype), (f"fused_{a.dot_dtype}", a.dot_dtype)] if a.dot_dtype else [])
    for kind, dd in kinds:
        f = head_loss(kind.split("_")[0], dd)
        fwd, fwd_bwd = jax.jit(f), jax.jit(jax.value_and_grad(f, argnums=(0, 1)))
        fns[f"head_fwd_{kind}"] = lambda fwd=fwd: fwd(head, h_BTD, batch)
        fns[f"head_fwd_bwd_{kind}"] = lambda fb=fwd_bwd: fb(head, h_BTD, batch)
    step_batch = {k: v[None] for k, v in batch.items()}  # one micro-batch: (A=1, R, T)
    step_batch = jax.device_put(step_batch, sharding.batch_sharding(mesh, batch_axis=1, ndim=3))
    texts = {}
    for kind, lc, lt in (("plain", 0, None), ("chunked", chunk, None), ("fused", 0, a.tokens)):
        box = [train.init_state(jax.tree.map(jnp.copy, params), tx)]
        update = train.make_update(cfg, tx, mesh, box[0], loss_chunk=lc, loss_tokens=lt)

        def step(box=box, update=update):
            box[0], m = update(box[0], step_batch)
            return m["loss"]

        fns[f"step_{kind}"] = step
        texts[kind] = cast(Any, update).lower(box[0], step_batch).compile().as_text() if a.ops else ""
    calls = {name: (lambda fn=fn: jax.block_until_ready(fn())) for name, fn in fns.items()}
    for fn in calls.values():
        fn()  # compile
    info = {"jax": jax.__version__, "mesh": dict(mesh.shape), "chunk": chunk, "tokens": fused_tokens, "step_hlo": texts}
    return calls, info


# ----------------------------------------------------------------------------- torch


def torch_parts(a) -> dict:
    """HF GPTJForCausalLM's parts (``PARTS``), each a ``serve`` call; "profile": the step under
    torch.profiler, its top operators by self CPU time."""
    import torch

    from hf_peer import adamw_step, hf_model

    s = _shape(a)
    model = hf_model(SimpleNamespace(dtype="float32", vocab=s["vocab"], d_model=s["d_model"], layers=s["n_layer"],
                                     heads=s["n_head"], rotary_dim=s["rotary_dim"], d_ff=s["d_ff"]), s["n_ctx"])
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, s["vocab"], (a.rows, a.seq), generator=g)
    labels = ids.clone()
    with torch.no_grad():
        h = model.transformer(ids).last_hidden_state
    ct = torch.randn(h.shape, generator=g)
    step = adamw_step(model)

    def head(h):
        logits = model.lm_head(h).float()
        return -torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, s["vocab"]), labels[:, 1:].reshape(-1),
                                                  reduction="sum")

    def body_fwd():
        with torch.no_grad():
            model.transformer(ids)

    def body_fwd_bwd():
        model.transformer(ids).last_hidden_state.backward(ct)
        model.zero_grad(set_to_none=True)

    def head_fwd():
        with torch.no_grad():
            head(h)

    def head_fwd_bwd():
        x = h.detach().requires_grad_(True)
        head(x).backward()
        model.zero_grad(set_to_none=True)

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)

    def optimizer():
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    fns = {"body_fwd": body_fwd, "body_fwd_bwd": body_fwd_bwd, "head_fwd": head_fwd, "head_fwd_bwd": head_fwd_bwd,
           "optimizer": optimizer, "step": lambda: step(input_ids=ids, labels=labels)}
    for fn in fns.values():
        fn()  # warm-up

    def profile() -> dict:
        from torch.profiler import ProfilerActivity, profile as prof

        with prof(activities=[ProfilerActivity.CPU]) as p:
            fns["step"]()
        rows = sorted(p.key_averages(), key=lambda e: -e.self_cpu_time_total)[:12]
        return {"top": [[e.key, round(e.self_cpu_time_total / 1e3, 1), e.count] for e in rows]}

    calls = {name: timed_reply(fn) for name, fn in fns.items()}
    calls["profile"] = profile
    calls["info"] = lambda: {"torch": torch.__version__, "torch_threads": torch.get_num_threads()}
    return calls


# ----------------------------------------------------------------------------- main


def _med(ts: list) -> float:
    return statistics.median(t[0] for t in ts)


def main(argv=None) -> None:
    a = parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    if a.torch_serve:
        serve(torch_parts(a))
        return
    peer = None if a.no_peer else Peer(__file__, [x for x in argv if x != "--no-peer"], serve_flag="--torch-serve").ready()
    calls, info = engine_parts(a)
    texts = info.pop("step_hlo")
    result = {"cpu": cpu_name(), "threads": threads(), "loadavg_start": round(os.getloadavg()[0], 2),
              "rounds": a.rounds, "shape": {"rows": a.rows, "seq": a.seq, **_shape(a)}, **info}
    sides = {f"engine_{k}": (lambda fn=fn: timed(fn)) for k, fn in calls.items()}
    if peer is not None:
        result.update(peer.ask("info"))
        for part in PARTS:
            sides[f"hf_{part}"] = lambda part=part: tuple(peer.ask(part)[k] for k in ("s", "cpu"))
    names = list(sides)
    times = dict(zip(names, rotate([logged(n, sides[n]) for n in names], a.rounds)))
    ms = {n: round(1e3 * _med(t), 1) for n, t in times.items()}
    for kind in ("plain", "chunked", "fused") + ((f"chunked_{a.dot_dtype}", f"fused_{a.dot_dtype}") if a.dot_dtype else ()):
        ms[f"engine_head_bwd_{kind}"] = round(ms[f"engine_head_fwd_bwd_{kind}"] - ms[f"engine_head_fwd_{kind}"], 1)
    ms["engine_body_bwd"] = round(ms["engine_body_fwd_bwd"] - ms["engine_body_fwd"], 1)
    if peer is not None:
        ms["hf_head_bwd"] = round(ms["hf_head_fwd_bwd"] - ms["hf_head_fwd"], 1)
        ms["hf_body_bwd"] = round(ms["hf_body_fwd_bwd"] - ms["hf_body_fwd"], 1)
        for kind in ("plain", "chunked", "fused"):  # > 1: the engine is faster
            result[f"step_hf_over_engine_{kind}"] = paired_ratio(times[f"engine_step_{kind}"], times["hf_step"], 0)
            result[f"head_fwd_bwd_hf_over_engine_{kind}"] = paired_ratio(times[f"engine_head_fwd_bwd_{kind}"],
                                                                         times["hf_head_fwd_bwd"], 0)
        result["hf_step_profile_top"] = peer.ask("profile")["top"]
        peer.close()
    result["step_plain_over_chunked"] = paired_ratio(times["engine_step_chunked"], times["engine_step_plain"], 0)
    result["head_plain_over_chunked"] = paired_ratio(times["engine_head_fwd_bwd_chunked"],
                                                     times["engine_head_fwd_bwd_plain"], 0)
    result["step_chunked_over_fused"] = paired_ratio(times["engine_step_fused"], times["engine_step_chunked"], 0)
    result["head_chunked_over_fused"] = paired_ratio(times["engine_head_fwd_bwd_fused"],
                                                     times["engine_head_fwd_bwd_chunked"], 0)
    if a.ops:  # after the timed rounds: the profiler's own cost stays out of them
        import xla_ops

        result["ops"] = {}
        for kind, text in texts.items():
            rows = xla_ops.label(xla_ops.op_profile(calls[f"step_{kind}"]), [text])
            print(f"XLA's per-op profile, the {kind} step (ms per step):", file=sys.stderr)
            print(xla_ops.table(rows, 12), file=sys.stderr)
            result["ops"][kind] = {"parts_ms": xla_ops.parts(rows),
                                   "top": [[r.name, round(r.ms, 1), xla_ops.part(r), r.shape, r.source[-60:]]
                                           for r in rows[:12]]}
    result["median_ms"] = ms
    result["loadavg_end"] = round(os.getloadavg()[0], 2)
    print(f"{result['cpu']}, {result['threads']} threads, load {result['loadavg_start']} -> {result['loadavg_end']}; "
          f"median ms of {a.rounds} interleaved rounds")
    print(f"{'part':16s} {'plain':>9s} {'chunked':>9s} {'fused':>9s} {'HF torch':>9s}   (body, optimizer: one program)")
    for part in ("body_fwd", "body_bwd", "head_fwd", "head_bwd", "optimizer", "step"):
        split = part.startswith("head") or part == "step"
        e = [ms.get(f"engine_{part}_{k}" if split else f"engine_{part}") for k in ("plain", "chunked", "fused")]
        cells = [f"{x:9.1f}" if x is not None else f"{'':9s}" for x in (*e, ms.get(f"hf_{part}"))]
        print(f"{part:16s} " + " ".join(cells))
    for row in result.get("hf_step_profile_top", []):
        print(f"  torch {row[0]:40s} {row[1]:9.1f} ms self CPU x{row[2]}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
