"""The workloads of ``check.py``: parity, training, generation, and reading the demo's
result. Each returns one dict of figures. Shapes: ``shape(kind, tiny)``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

# The timed shapes: Qwen2.5-1.5B (the backend's preset, bf16 compute) and a tiny one of
# the same family for the CPU self-test. Generation: prompts of ~prompt tokens, k
# samples each, new tokens each (every row runs to its budget: no end-of-text).
SHAPES: dict[bool, dict[str, Any]] = {
    False: {"preset": "qwen2.5-1.5b", "over": {"n_ctx": 1024}, "seq": 1024,
            "prompts": 256, "prompt": 400, "k": 4, "new": 256},
    True: {"preset": "qwen2.5-1.5b", "over": {"n_layer": 2, "d_model": 64, "n_head": 4, "n_kv_head": 2,
                                              "d_head": 16, "d_ff": 128, "vocab": 512, "n_ctx": 128},
           "seq": 128, "prompts": 8, "prompt": 40, "k": 4, "new": 16},
}


# The LoRA check: Llama-3.1-8B's shape (untied, 128k vocabulary), rank 32 on every projection.
LORA_SHAPES: dict[bool, dict[str, Any]] = {
    False: {"preset": "llama-3.1-8b", "over": {"n_ctx": 1024}, "seq": 1024, "rank": 32},
    True: {"preset": "llama-3.1-8b", "over": {"n_layer": 2, "d_model": 64, "n_head": 4, "n_kv_head": 2,
                                              "d_head": 16, "d_ff": 128, "vocab": 512, "n_ctx": 128}, "seq": 128,
           "rank": 4},
}


def shape(kind: str, tiny: bool) -> dict:
    from star_haiku_xmap.model.config import preset

    s = dict((LORA_SHAPES if kind == "train_lora" else SHAPES)[tiny])
    s["config"] = preset(s["preset"], dtype="bfloat16", **s["over"])
    s["name"] = s["preset"] + ("-tiny" if tiny else "")
    return s


def matmul_params(cfg) -> int:
    """Parameters that take part in a matmul per token: every projection and the LM
    head (once, tied or not); not the embedding lookup, norms or biases."""
    D, F, L, V = cfg.d_model, cfg.d_ff, cfg.n_layer, cfg.vocab
    H, Q = cfg.n_head, cfg.d_head
    G = getattr(cfg, "n_kv_head", H)
    mlp = 3 * D * F if hasattr(cfg, "n_kv_head") else 2 * D * F
    return L * (2 * D * H * Q + 2 * D * G * Q + mlp) + D * V


def train_flops_per_token(cfg, T: int, lora: bool = False) -> float:
    """PaLM appendix B: 6 N + 12 L H Q T. With LoRA the frozen base's weight gradients are
    never computed: 4 N (forward, and the gradient of the activations) + the attention's 12 L H Q T
    (the adapters' own matmuls, under 1 % at rank 32, are left out)."""
    return (4 if lora else 6) * matmul_params(cfg) + 12 * cfg.n_layer * cfg.n_head * cfg.d_head * T


def param_bytes(params) -> int:
    import jax

    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))


# ----------------------------------------------------------------------------- parity


def parity() -> dict:
    """GPT-J and Llama tiny fp32 logits on the default device against the CPU."""
    import jax

    from star_haiku_xmap.model import network as model
    from star_haiku_xmap.model.config import preset

    cpu = jax.devices("cpu")[0]
    dev = jax.devices()[0]
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {}
    for name in ("gptj", "llama"):
        cfg = preset("tiny" if name == "gptj" else "llama-tiny", dtype="float32")
        tokens = rng.integers(0, cfg.vocab, (2, 48)).astype(np.int32)
        with jax.default_device(cpu):
            params_cpu = model.init_params(cfg, 0)
            with jax.default_matmul_precision("highest"):
                ref = np.asarray(model.forward(params_cpu, tokens, cfg))
        params_dev = jax.device_put(params_cpu, dev)
        with jax.default_matmul_precision("highest"):
            got = np.asarray(model.forward(params_dev, jax.device_put(tokens, dev), cfg))
        default = np.asarray(model.forward(params_dev, jax.device_put(tokens, dev), cfg))
        scale = float(np.abs(ref).max())
        out[name] = {"max_abs_diff": float(np.abs(got - ref).max()),
                     "max_abs_diff_default_precision": float(np.abs(default - ref).max()),
                     "logit_scale": scale, "greedy_equal": bool((got.argmax(-1) == ref.argmax(-1)).all())}
    out["ok"] = all(v["max_abs_diff"] <= 1e-4 * max(1.0, v["logit_scale"]) for v in out.values())
    return out


# ----------------------------------------------------------------------------- training


def packed_batch(rng: np.random.Generator, A: int, R: int, T: int, vocab: int) -> dict:
    """One step's batch of A x R rows of T tokens, each row filled with examples of
    64-512 tokens (the last one takes what is left, at least 16) through the backend's
    own packed collation; loss on each example's last two thirds."""
    from star_haiku_xmap.train import packing
    from star_haiku_xmap.train import packplan

    encoded, rows = [], []
    for _ in range(A * R):
        row, used = [], 0
        while used < T:
            n = int(rng.integers(64, 513))
            n = T - used if T - used - n < 16 else n
            encoded.append(packing.Encoded(rng.integers(1, vocab, n).astype(np.int32), n // 3))
            row.append(len(encoded) - 1)
            used += n
        rows.append(row)
    step = packplan.PackedStep(np.arange(len(encoded)), R, T, rows)
    return packing.collate_packed(encoded, step, grad_accum=A, pad_id=0)


def train(s: dict, a, pk: dict, adapter: dict | None = None) -> dict:
    """Steady-state optimizer steps on one device: bf16 compute, per-layer rematerialisation;
    fp32 master weights and moments, or (``adapter``) fp32 LoRA adapters and moments over the
    frozen bf16 base."""
    import jax

    from star_haiku_xmap.model import lora
    from star_haiku_xmap.model import network as model
    from star_haiku_xmap.train import trainer as tr
    from star_haiku_xmap.options import AdamW

    cfg, T, A, R = s["config"], s["seq"], a.train_accum, a.train_rows
    spec = None if adapter is None else lora.check_table(adapter, cfg, "adapter")
    tx = AdamW.from_table({"lr": 1e-5, "warmup_steps": 0}).build(1000)
    params = model.init_params(cfg, 0)
    frozen: tuple[Any, ...]  # the frozen base's parameters after the state (LoRA), or none
    if spec is None:
        state, frozen = tr.init_state(tr.master_params(params, "float32"), tx), ()
    else:
        state, frozen = tr.init_state(tr.fresh_adapters(cfg, spec, 0), tx), (params,)
    update = tr.make_update(cfg, tx, remat=True, adapter=spec)
    rng = np.random.default_rng(0)
    batches = [jax.device_put(packed_batch(rng, A, R, T, cfg.vocab)) for _ in range(2)]
    t0 = time.perf_counter()
    state, m = update(state, batches[0], *frozen)
    jax.block_until_ready(m)
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(a.train_steps):
        state, m = update(state, batches[i % 2], *frozen)
    jax.block_until_ready((state, m))
    step_s = (time.perf_counter() - t0) / a.train_steps
    tokens = A * R * T
    fpt = train_flops_per_token(cfg, T, lora=spec is not None)
    row = {"shape": s["name"], "params": int(sum(x.size for x in jax.tree.leaves(params))),
           "trained": int(sum(x.size for x in jax.tree.leaves(state.params))),
           "rows": A * R, "seq": T, "grad_accum": A, "compute": cfg.dtype,
           "master": "float32" if spec is None else "frozen bf16 base, fp32 adapters",
           "attention": layers_kind(), "first_step_s": round(compile_s, 2), "step_s": round(step_s, 4),
           "tokens_per_s": round(tokens / step_s, 1), "flops_per_token": fpt, "loss": float(m["loss"]),
           "peak_source": pk["peak_source"]}
    if spec is not None:
        row["lora"] = spec.to_dict()
    if pk["peak_flops"]:
        row["mfu"] = round(fpt * tokens / step_s / pk["peak_flops"], 4)
    return row


def layers_kind() -> str:
    """Which attention the traced steps used (``layers.attention_kind``)."""
    from star_haiku_xmap.model.layers import attention_kind

    return attention_kind()


def train_lora(a, pk: dict) -> dict:
    """Llama-3.1-8B-shaped, LoRA rank 32 (--tiny: 4) on every projection over the frozen bf16 base."""
    s = shape("train_lora", a.tiny)
    return train(s, a, pk, adapter={"kind": "lora", "rank": s["rank"], "alpha": 2 * s["rank"]})


# ----------------------------------------------------------------------------- generation


def generate(s: dict, a, pk: dict) -> dict:
    """Continuous batching: ``prompts`` random prompts of prompt +- 5 % tokens, k
    sampled continuations of each (one prefill per prompt), ``new`` tokens each."""

    from star_haiku_xmap.model import network as model
    from star_haiku_xmap.options import DecodeConfig
    from star_haiku_xmap.sampling import continuous

    cfg = s["config"]
    params = model.init_params(cfg, 0)
    rng = np.random.default_rng(1)
    lo, hi = int(s["prompt"] * 0.95), int(s["prompt"] * 1.05)
    base = [rng.integers(1, cfg.vocab, int(rng.integers(lo, hi + 1))).tolist() for _ in range(s["prompts"])]
    prompts = [p for p in base for _ in range(s["k"])]
    seeds = list(range(len(prompts)))
    budgets = [s["new"]] * len(prompts)

    def call(stats):
        return continuous.generate(params, prompts, seeds, budgets, config=cfg, stats=stats,
                                   decode=DecodeConfig(temperature=1.0, top_p=1.0, eos_id=-1, pad_id=0,
                                                       slots=a.slots, chunk=32))

    t0 = time.perf_counter()
    out = call({})
    first_s = time.perf_counter() - t0
    stats: dict = {}
    t0 = time.perf_counter()
    out = call(stats)
    wall = time.perf_counter() - t0
    useful = sum(len(o) for o in out)
    kv_per_token = 2 * cfg.n_layer * cfg.n_kv_head * cfg.d_head * np.dtype(model.dtype_of(cfg)).itemsize
    # Bytes a decode step must read at least: every weight once per step, and each row's
    # keys/values so far once per new token of that row.
    weights = param_bytes(params)
    kv_read = sum(kv_per_token * sum(range(len(p), len(p) + len(o))) for p, o in zip(prompts, out))
    row = {"shape": s["name"], "requests": len(prompts), "prompts": len(base), "k": s["k"],
           "prompt_tokens_mean": round(float(np.mean([len(p) for p in base])), 1), "new_tokens": s["new"],
           "slots": a.slots, "attention": layers_kind(), "first_call_s": round(first_s, 2), "wall_s": round(wall, 3),
           "useful_tokens": useful, "useful_tokens_per_s": round(useful / wall, 1),
           "decode_steps": stats.get("decode_steps"), "prefill_rows": stats.get("prefill_rows"),
           "weight_bytes": weights, "kv_bytes_read": kv_read, "peak_source": pk["peak_source"]}
    if pk["peak_bandwidth"] and stats.get("decode_steps"):
        bound_s = (stats["decode_steps"] * weights + kv_read) / pk["peak_bandwidth"]
        row["bandwidth_bound_s"] = round(bound_s, 4)
        row["bandwidth_fraction"] = round(bound_s / wall, 4)
    return row


# ----------------------------------------------------------------------------- the demo


def demo_accuracy(run_dir: Path) -> dict:
    """Dev accuracy (overall) per finished iteration of a run, from its metrics.parquet."""
    import pyarrow.parquet as pq

    path = run_dir / "metrics.parquet"
    if not path.is_file():
        return {"iterations_done": 0}
    rows = [r for r in pq.read_table(path).to_pylist() if r["split"] == "dev" and r["class"] == "all"]
    rows.sort(key=lambda r: r["iteration"])
    return {"iterations_done": max((r["iteration"] for r in rows), default=0),
            "dev_accuracy": [round(r["accuracy"], 4) if r["accuracy"] is not None else None for r in rows],
            "final_accuracy": rows[-1]["accuracy"] if rows else None}
