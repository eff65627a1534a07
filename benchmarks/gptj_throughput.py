"""GPT-J (or, ``--arch llama``, Llama-style) throughput of the haiku_xmap backend
(and, with --peer, of HF transformers: ``GPTJForCausalLM`` / ``LlamaForCausalLM``).

Prints ONE JSON line: greedy generation and training tokens/s in steady state
(compilation timed separately), model FLOP utilisation against a matmul peak
measured here, device and thread count. ``--peer`` also times HF
``GPTJForCausalLM`` (torch, CPU, same shapes, dtype and thread count: greedy
``generate()`` with a fixed number of new tokens, and a clipped AdamW step) in a
child process (``hf_peer.py``), so the two runtimes' thread pools never compete.
The child is a server: JAX and HF calls alternate (ABBA order), one of each per
round, so both see the same machine load, and each ratio is the median of the
per-round ratios (on a shared machine the load swings more than the ratio does).
``*_ratio_cpu`` compares CPU seconds per call, which other processes' load
barely moves. Under load torch's default OpenMP threads spin at barriers and
collapse (10-40x slower at load 8), so by default the peer is probed with both
the default and the PASSIVE wait policy and keeps the faster per workload.

Token counts: generation counts new tokens (batch x new tokens); training counts
every input token (batch x sequence). FLOPs: 2 x matmul parameters per token
forward (embedding lookup excluded, LM head included) plus attention
4 x L x context x H x K forward; training is 3x forward.

    python benchmarks/gptj_throughput.py --layers 4 --d-model 256 --heads 8 --rotary-dim 16 \\
        --vocab 512 --gen-batch 32 --prompt 64 --new-tokens 96 --train-batch 8 --train-seq 256 --peer
    python benchmarks/gptj_throughput.py --arch llama --layers 4 --d-model 256 --heads 8 --kv-heads 4 \
        --d-ff 768 --vocab 512 --peer                   # the tiny Llama-style shape of docs/models.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from bench_common import (MALLOC_HELP, MALLOC_MODES, Peer, apply_malloc, choose_peers, cpu_name, first_call,
                    interleave, matmul_peak, paired_ratio, summarise, thp_mode, threads, timed)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", choices=("gptj", "llama"), default="gptj",
                    help="llama: RMSNorm, SwiGLU, grouped-query attention, rotate-half rope (llama.py)")
    ap.add_argument("--kv-heads", type=int, default=None, help="--arch llama: key/value heads (default heads / 2)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--d-ff", type=int, default=None, help="default 4 x d-model")
    ap.add_argument("--rotary-dim", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--gen-batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--train-batch", type=int, default=8)
    ap.add_argument("--train-seq", type=int, default=256)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--repeats", type=int, default=5, help="timed generate() calls (rounds with --peer)")
    ap.add_argument("--train-steps", type=int, default=8, help="timed train steps (rounds with --peer)")
    ap.add_argument("--cpu-devices", type=int, default=None,
                    help="XLA:CPU devices the JAX side shards the batch over (a dp mesh; model.cpu_devices); "
                         "default: one per thread")
    ap.add_argument("--peer", action="store_true", help="also time HF transformers GPT-J in a child process")
    ap.add_argument("--ceiling", action="store_true",
                    help="also time generation and training with the attention left out (ceiling.py): the most "
                         "any attention kernel or cache scheme could reach here")
    ap.add_argument("--hf-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--hf-serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--malloc", choices=MALLOC_MODES, default="default", help=MALLOC_HELP)
    ap.add_argument("--hf-omp-wait-policy", choices=("auto", "default", "passive"), default="auto",
                    help="OpenMP wait policy of the HF peer; auto probes both and keeps the faster per workload "
                         "(torch's spinning threads collapse when other processes share the cores)")
    a = ap.parse_args(argv)
    a.d_ff = a.d_ff or 4 * a.d_model
    a.kv_heads = (a.kv_heads or max(1, a.heads // 2)) if a.arch == "llama" else a.heads
    a.cpu_devices = a.cpu_devices or threads()
    if a.heads % a.kv_heads:
        ap.error("kv-heads must divide heads")
    if a.arch == "llama" and a.ceiling:
        ap.error("--ceiling: GPT-J only (ceiling.py)")
    if a.d_model % a.heads or (a.arch == "gptj" and a.rotary_dim > a.d_model // a.heads):
        ap.error("d-model must be a multiple of heads and rotary-dim <= d-model / heads")
    return a


def flops_per_token(a, context: float, train: bool) -> float:
    D, F, L, V = a.d_model, a.d_ff, a.layers, a.vocab
    K = D // a.heads
    if a.arch == "llama":  # q and out: H x K each side; k, v: G x K; gate, up, down
        matmul_params = L * (2 * D * a.heads * K + 2 * D * a.kv_heads * K + 3 * D * F) + D * V
    else:
        matmul_params = L * (4 * D * D + 2 * D * F) + D * V
    fwd = 2 * matmul_params + 4 * L * context * a.heads * K
    return 3 * fwd if train else fwd


# ----------------------------------------------------------------------------- jax


def jax_workloads(a) -> tuple[dict, object, object]:
    """(info, generate(), train_step()) for the haiku_xmap backend; both compiled here."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from star_haiku_xmap.model import network as model
    from star_haiku_xmap.train import packing
    from star_haiku_xmap.runtime import sharding
    from star_haiku_xmap.train import trainer as train
    from star_haiku_xmap.sampling import static as sample
    from star_haiku_xmap.model.config import GPTJConfig, LlamaConfig, ModelConfig
    from star_haiku_xmap.session.machine import set_cpu_devices
    from star_haiku_xmap.options import AdamW

    set_cpu_devices(a.cpu_devices)  # model.cpu_devices: before jax starts its backends

    n_ctx = max(a.prompt + a.new_tokens, a.train_seq)
    cfg: ModelConfig
    if a.arch == "llama":
        cfg = LlamaConfig(n_layer=a.layers, d_model=a.d_model, n_head=a.heads, n_kv_head=a.kv_heads,
                          d_head=a.d_model // a.heads, d_ff=a.d_ff, n_ctx=n_ctx, vocab=a.vocab, dtype=a.dtype)
    else:
        cfg = GPTJConfig(n_layer=a.layers, d_model=a.d_model, n_head=a.heads, d_head=a.d_model // a.heads,
                         d_ff=a.d_ff, rotary_dim=a.rotary_dim, n_ctx=n_ctx, vocab=a.vocab, dtype=a.dtype)
    # The backend's own layout: params by the rule table, the batch split over "dp".
    mesh = sharding.make_mesh({"dp": -1, "mp": 1})
    params = sharding.shard_tree(model.init_params(cfg, 0), mesh)
    rng = np.random.default_rng(0)
    info: dict = {"mesh": dict(mesh.shape)}

    rows = sharding.batch_sharding(mesh)
    prompt = jax.device_put(rng.integers(0, a.vocab, (a.gen_batch, a.prompt)).astype(np.int32), rows)
    mask = jax.device_put(np.ones((a.gen_batch, a.prompt), bool), rows)
    keys = jax.device_put(sample.keys_from_seeds(range(a.gen_batch)), sharding.batch_sharding(mesh, ndim=1))

    def gen():  # eos_id -1: never matched, so every row makes exactly new_tokens tokens (as HF's min_new_tokens)
        return sample.generate(params, prompt, mask, keys, 0.0, 1.0, config=cfg, max_new_tokens=a.new_tokens,
                               eos_id=-1, mesh=mesh).block_until_ready()

    info["generate_first_call_s"] = first_call(gen)

    tx = AdamW.from_table({"lr": 1e-4, "warmup_steps": 0}).build(1000)
    state = train.init_state(jax.tree.map(jnp.copy, params), tx)  # the update donates its state
    update = train.make_update(cfg, tx, mesh, state)
    tokens = rng.integers(0, a.vocab, (1, a.train_batch, a.train_seq)).astype(np.int32)
    batch = jax.device_put(packing.dense_batch(tokens), sharding.batch_sharding(mesh, batch_axis=1, ndim=3))
    box: list[Any] = [state, None]  # the state and the last step's metrics

    def step():
        box[0], box[1] = update(box[0], batch)
        jax.block_until_ready(box)

    info["train_first_call_s"] = first_call(step)
    if a.ceiling:
        info["ceilings"] = _ceilings(a, cfg, mesh, params, tx, prompt, mask, tokens[0])
    info["loss"] = lambda: round(float(box[1]["loss"]), 4)
    info["device"] = (f"cpu: {cpu_name()}" if jax.devices()[0].platform == "cpu" else str(jax.devices()[0]))
    info["jax"] = jax.__version__
    return info, gen, step


def _ceilings(a, cfg, mesh, params, tx, prompt, mask, tokens) -> dict:
    """{"generate": fn, "train": fn}: the attention-free bounds (ceiling.py), compiled."""
    import jax
    import jax.numpy as jnp

    import ceiling  # beside this script
    from star_haiku_xmap.runtime import sharding
    from star_haiku_xmap.train import trainer as train

    box = [train.init_state(jax.tree.map(jnp.copy, params), tx)]
    update = ceiling.make_dense_update(cfg, tx, mesh, box[0])
    tokens = jax.device_put(tokens, sharding.batch_sharding(mesh))

    def gen():
        ceiling.dense_generate(params, prompt, mask, config=cfg, max_new_tokens=a.new_tokens,
                               mesh=mesh).block_until_ready()

    def step():
        box[0], loss = update(box[0], tokens)
        jax.block_until_ready((box[0], loss))

    gen(), step()
    return {"generate": gen, "train": step}


def main(argv=None) -> None:
    import hf_peer  # beside this script; torch and transformers are imported only when it runs

    a = parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    apply_malloc(a.malloc, __file__, argv)  # the HF children inherit the settings
    if a.hf_serve:
        hf_peer.hf_serve(a)
        return
    if a.hf_only:  # standalone HF timings (no interleaving)
        info, gen, step = hf_peer.hf_workloads(a)
        tg, tt = [timed(gen) for _ in range(a.repeats)], [timed(step) for _ in range(a.train_steps)]
        print(json.dumps({**info, **summarise("hf_generate", tg, a.gen_batch * a.new_tokens),
                          **summarise("hf_train", tt, a.train_batch * a.train_seq)}))
        return
    result = {"arch": a.arch, "dtype": a.dtype, "threads": threads(), "malloc": a.malloc, "thp": thp_mode(), "loadavg_start": round(os.getloadavg()[0], 2),
              "shape": {k: getattr(a, k) for k in ("layers", "d_model", "heads",
                                                   *(("kv_heads",) if a.arch == "llama" else ("rotary_dim",)),
                                                   "d_ff", "vocab",
                                                   "gen_batch", "prompt", "new_tokens", "train_batch", "train_seq")}}
    # The peers start first: their import and warm-up must not overlap the JAX timings.
    policies = {"auto": ("default", "passive")}.get(a.hf_omp_wait_policy, (a.hf_omp_wait_policy,))
    started = [Peer(__file__, [x for x in argv if x != "--peer"], policy) for policy in policies] if a.peer else []
    peers = choose_peers([p.ready() for p in started], ("gen", "train")) if started else None
    info, gen, step = jax_workloads(a)
    gen_tokens, train_tokens = a.gen_batch * a.new_tokens, a.train_batch * a.train_seq

    def rounds(fn, cmd: str, n: int) -> tuple[list, list | None]:
        """(wall, CPU) of n JAX calls and, with --peer, of n HF ``cmd`` calls alternating with them."""
        if peers is None:
            return [timed(fn) for _ in range(n)], None
        return interleave(fn, lambda: peers[cmd].ask(cmd), n)

    tg, hg = rounds(gen, "gen", a.repeats)
    tt, ht = rounds(step, "train", a.train_steps)
    for what, fn in info.get("ceilings", {}).items():  # --ceiling: timed like the real calls, in rounds
        cmd, n, tokens = ("gen", a.repeats, gen_tokens) if what == "generate" else ("train", a.train_steps, train_tokens)
        tc, hc = rounds(fn, cmd, n)
        result[f"{what}_ceiling_tokens_per_s"] = summarise("c", tc, tokens)["c_tokens_per_s"]
        if peers is not None:
            assert hc is not None  # rounds() times the peers whenever there are peers
            result[f"{what}_ceiling_ratio_jax_over_hf"] = paired_ratio(tc, hc, 0)
    result.update(summarise("generate", tg, gen_tokens))
    result["generate_compile_s"] = round(info["generate_first_call_s"] - result["generate_s"], 3)
    result.update({k.replace("_s", "_step_s") if k == "train_s" else k: v
                   for k, v in summarise("train", tt, train_tokens).items()})
    result["train_compile_s"] = round(info["train_first_call_s"] - result["train_step_s"], 3)
    result["train_loss"] = info["loss"]()
    result["peaks"] = {k: round(v / 1e9, 1) for k, v in matmul_peak(a.dtype).items()}
    result["device"], result["jax"], result["mesh"] = info["device"], info["jax"], info["mesh"]
    if peers is not None:
        assert hg is not None and ht is not None  # rounds() times the peers whenever there are peers
        peer = peers["train"]
        result["peaks"].update({k: round(v / 1e9, 1) for k, v in peer.ask("peak")["peaks"].items()})
        result.update(peer.ask("info"))
        result["hf_omp_wait_policy"] = {("generate" if w == "gen" else w): p.wait_policy for w, p in peers.items()}
        for p in set(peers.values()):
            p.close()
        result.update({k.replace("hf_train_s", "hf_train_step_s"): v for k, v in
                       {**summarise("hf_generate", hg, gen_tokens), **summarise("hf_train", ht, train_tokens)}.items()})
        # Paired per-round ratios of wall time (same load on both sides); "_best"
        # compares the two best calls; "_cpu" compares CPU time per call, which
        # load barely changes (a torch thread spinning at a barrier counts as CPU).
        for what, (tj, th) in (("generate", (tg, hg)), ("train", (tt, ht))):
            result[f"{what}_ratio_jax_over_hf"] = paired_ratio(tj, th, 0)
            result[f"{what}_ratio_best"] = round(min(h[0] for h in th) / min(j[0] for j in tj), 2)
            result[f"{what}_ratio_cpu"] = paired_ratio(tj, th, 1)
    # MFU against the best matmul any library reached here (fp32 peak for fp32 runs).
    peak = max(result["peaks"].values()) * 1e9
    gen_flops = gen_tokens * flops_per_token(a, a.prompt + a.new_tokens / 2, False)
    train_flops = train_tokens * flops_per_token(a, a.train_seq, True)
    result["matmul_peak_gflops"] = round(peak / 1e9, 1)
    result["generate_mfu"] = round(gen_flops / result["generate_s"] / peak, 4)
    result["mfu"] = round(train_flops / result["train_step_s"] / peak, 4)
    if peers is not None:
        result["hf_generate_mfu"] = round(gen_flops / result["hf_generate_s"] / peak, 4)
        result["hf_mfu"] = round(train_flops / result["hf_train_step_s"] / peak, 4)
    result["loadavg_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
