"""GPT-J throughput of the haiku_xmap backend (and, with --peer, of HF transformers).

Prints ONE JSON line: greedy generation and training tokens/s in steady state
(compilation timed separately), model FLOP utilisation against a matmul peak
measured here, device and thread count. ``--peer`` also times HF
``GPTJForCausalLM`` (torch, CPU, same shapes, dtype and thread count: greedy
``generate()`` with a fixed number of new tokens, and a clipped AdamW step) in a
child process, so the two runtimes' thread pools never compete, and adds
jax/hf ratios.

Token counts: generation counts new tokens (batch x new tokens); training counts
every input token (batch x sequence). FLOPs: 2 x matmul parameters per token
forward (embedding lookup excluded, LM head included) plus attention
4 x L x context x D forward; training is 3x forward.

    python benchmarks/gptj_throughput.py --layers 4 --d-model 256 --heads 8 --rotary-dim 16 \\
        --vocab 512 --gen-batch 32 --prompt 64 --new-tokens 96 --train-batch 8 --train-seq 256 --peer
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    ap.add_argument("--repeats", type=int, default=3, help="timed generate() calls")
    ap.add_argument("--train-steps", type=int, default=8, help="timed train steps")
    ap.add_argument("--peer", action="store_true", help="also time HF transformers GPT-J in a child process")
    ap.add_argument("--hf-only", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.d_ff = a.d_ff or 4 * a.d_model
    if a.d_model % a.heads or a.rotary_dim > a.d_model // a.heads:
        ap.error("d-model must be a multiple of heads and rotary-dim <= d-model / heads")
    return a


def threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def flops_per_token(a, context: float, train: bool) -> float:
    D, F, L, V = a.d_model, a.d_ff, a.layers, a.vocab
    matmul_params = L * (4 * D * D + 2 * D * F) + D * V
    fwd = 2 * matmul_params + 4 * L * context * D
    return 3 * fwd if train else fwd


def timings(fn, n: int) -> tuple[float, float]:
    """(best, median) seconds of ``n`` calls. Throughputs use the best call: on a
    shared machine it is the least disturbed by other processes."""
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times), statistics.median(times)


# ----------------------------------------------------------------------------- jax


def matmul_peak(dtype: str, libraries=("xla", "numpy")) -> dict[str, float]:
    """Best FLOP/s of square matmuls per library (numpy only for fp32)."""
    import numpy as np

    peaks: dict[str, float] = {}
    for n in (1024, 2048):
        x = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
        if "xla" in libraries:
            import jax
            import jax.numpy as jnp

            xj = jnp.asarray(x, dtype)
            f = jax.jit(lambda a: a @ a)
            f(xj).block_until_ready()
            t, _ = timings(lambda: f(xj).block_until_ready(), 5)
            peaks["xla"] = max(peaks.get("xla", 0.0), 2 * n ** 3 / t)
        if "numpy" in libraries and dtype == "float32":
            t, _ = timings(lambda: x @ x, 5)
            peaks["numpy"] = max(peaks.get("numpy", 0.0), 2 * n ** 3 / t)
        if "torch" in libraries:
            import torch

            xt = torch.from_numpy(x).to(getattr(torch, dtype))
            xt @ xt
            t, _ = timings(lambda: xt @ xt, 5)
            peaks["torch"] = max(peaks.get("torch", 0.0), 2 * n ** 3 / t)
    return peaks


def run_jax(a) -> dict:
    import jax
    import numpy as np

    from star_haiku_xmap import model, sample, train
    from star_haiku_xmap.config import GPTJConfig

    cfg = GPTJConfig(n_layer=a.layers, d_model=a.d_model, n_head=a.heads, d_head=a.d_model // a.heads,
                     d_ff=a.d_ff, rotary_dim=a.rotary_dim, n_ctx=max(a.prompt + a.new_tokens, a.train_seq),
                     vocab=a.vocab, dtype=a.dtype)
    params = model.init_params(cfg, 0)
    rng = np.random.default_rng(0)
    out: dict = {}

    prompt = rng.integers(0, a.vocab, (a.gen_batch, a.prompt)).astype(np.int32)
    mask = np.ones_like(prompt, bool)
    keys = sample.keys_from_seeds(range(a.gen_batch))

    def gen():  # eos_id -1: never matched, so every row makes exactly new_tokens tokens (as HF's min_new_tokens)
        return sample.generate(params, prompt, mask, keys, 0.0, 1.0, config=cfg, max_new_tokens=a.new_tokens,
                               eos_id=-1).block_until_ready()

    t = time.perf_counter()
    gen()
    first = time.perf_counter() - t
    dt, med = timings(gen, a.repeats)
    out["generate_compile_s"] = round(first - dt, 3)
    out["generate_s"] = round(dt, 4)
    out["generate_tokens_per_s"] = round(a.gen_batch * a.new_tokens / dt, 1)
    out["generate_tokens_per_s_median"] = round(a.gen_batch * a.new_tokens / med, 1)

    tx = train.make_optimizer({"lr": 1e-4, "clip_norm": 1.0}, 1000)
    state = train.init_state(params, tx)
    update = train.make_update(cfg, tx)
    tokens = rng.integers(0, a.vocab, (1, a.train_batch, a.train_seq)).astype(np.int32)
    batch = {"tokens": tokens, "mask": np.ones_like(tokens, bool), "loss_mask": np.ones_like(tokens, bool)}
    t = time.perf_counter()
    state, m = update(state, batch)
    jax.block_until_ready(m)
    first = time.perf_counter() - t
    box = [state]

    def step():
        box[0], metrics = update(box[0], batch)
        jax.block_until_ready((box[0], metrics))
        box.append(metrics)

    dt, med = timings(step, a.train_steps)
    out["train_compile_s"] = round(first - dt, 3)
    out["train_step_s"] = round(dt, 4)
    out["train_tokens_per_s"] = round(a.train_batch * a.train_seq / dt, 1)
    out["train_tokens_per_s_median"] = round(a.train_batch * a.train_seq / med, 1)
    out["train_loss"] = round(float(box[-1]["loss"]), 4)
    out["peaks"] = {k: round(v / 1e9, 1) for k, v in matmul_peak(a.dtype).items()}
    out["device"] = f"{jax.devices()[0].platform}: {cpu_name()}" if jax.devices()[0].platform == "cpu" else str(jax.devices()[0])
    out["jax"] = jax.__version__
    return out


# ----------------------------------------------------------------------------- HF peer


def run_hf(a) -> dict:
    import numpy as np
    import torch
    from transformers import GPTJConfig, GPTJForCausalLM

    torch.set_num_threads(threads())
    torch.manual_seed(0)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[a.dtype]
    cfg = GPTJConfig(vocab_size=a.vocab, n_positions=max(a.prompt + a.new_tokens, a.train_seq), n_embd=a.d_model,
                     n_layer=a.layers, n_head=a.heads, rotary_dim=a.rotary_dim, n_inner=a.d_ff,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=False)
    model = GPTJForCausalLM(cfg).to(dtype).eval()
    rng = np.random.default_rng(0)
    prompt = torch.from_numpy(rng.integers(0, a.vocab, (a.gen_batch, a.prompt))).long()
    attn = torch.ones_like(prompt)

    def gen():
        with torch.inference_mode():
            o = model.generate(prompt, attention_mask=attn, do_sample=False, max_new_tokens=a.new_tokens,
                               min_new_tokens=a.new_tokens, pad_token_id=0, eos_token_id=None)
        assert o.shape == (a.gen_batch, a.prompt + a.new_tokens)

    out: dict = {}
    t = time.perf_counter()
    gen()
    first = time.perf_counter() - t
    dt, _ = timings(gen, a.repeats)
    out["hf_generate_warmup_s"] = round(first, 3)
    out["hf_generate_s"] = round(dt, 4)
    out["hf_generate_tokens_per_s"] = round(a.gen_batch * a.new_tokens / dt, 1)

    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    ids = torch.from_numpy(rng.integers(0, a.vocab, (a.train_batch, a.train_seq))).long()

    def step():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss)

    step()
    dt, _ = timings(step, a.train_steps)
    out["hf_train_step_s"] = round(dt, 4)
    out["hf_train_tokens_per_s"] = round(a.train_batch * a.train_seq / dt, 1)
    out["torch"] = torch.__version__
    out["hf_threads"] = torch.get_num_threads()
    out["peaks"] = {k: round(v / 1e9, 1) for k, v in matmul_peak(a.dtype, ("torch",)).items()}
    return out


def main(argv=None) -> None:
    a = parse_args(argv)
    if a.hf_only:
        print(json.dumps(run_hf(a)))
        return
    result = {"dtype": a.dtype, "threads": threads(), "loadavg_start": round(os.getloadavg()[0], 2),
              "shape": {k: getattr(a, k) for k in ("layers", "d_model", "heads", "d_ff", "rotary_dim", "vocab",
                                                   "gen_batch", "prompt", "new_tokens", "train_batch", "train_seq")}}
    result.update(run_jax(a))
    if a.peer:
        argv_hf = [sys.executable, str(Path(__file__).resolve()), "--hf-only"] + (sys.argv[1:] if argv is None else argv)
        proc = subprocess.run([x for x in argv_hf if x != "--peer"], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"HF peer failed:\n{proc.stderr[-3000:]}")
        hf = json.loads(proc.stdout.strip().splitlines()[-1])
        result["peaks"].update(hf.pop("peaks"))
        result.update(hf)
        result["generate_ratio_jax_over_hf"] = round(result["generate_tokens_per_s"] / result["hf_generate_tokens_per_s"], 2)
        result["train_ratio_jax_over_hf"] = round(result["train_tokens_per_s"] / result["hf_train_tokens_per_s"], 2)
    # MFU against the best matmul any library reached here (fp32 peak for fp32 runs).
    peak = max(result["peaks"].values()) * 1e9
    gen_flops = a.gen_batch * a.new_tokens * flops_per_token(a, a.prompt + a.new_tokens / 2, False)
    train_flops = a.train_batch * a.train_seq * flops_per_token(a, a.train_seq, True)
    result["matmul_peak_gflops"] = round(peak / 1e9, 1)
    result["generate_mfu"] = round(gen_flops / result["generate_s"] / peak, 4)
    result["mfu"] = round(train_flops / result["train_step_s"] / peak, 4)
    if "hf_train_step_s" in result:
        result["hf_generate_mfu"] = round(gen_flops / result["hf_generate_s"] / peak, 4)
        result["hf_mfu"] = round(train_flops / result["hf_train_step_s"] / peak, 4)
    result["loadavg_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
