"""Training throughput on STaR's own length mixes: packed rows (``packing =
"segments"``) against padded buckets (``"none"``), the same examples and steps.

Mixes: the addition demo's (``experiments/addition.toml``: the base model's 1,500
seed examples, and an iteration's 1-5 digit scratchpads, both through the
arithmetic task plugin and the byte tokenizer) and a CommonsenseQA-shaped one
(prompts of 100-200 tokens, completions of 30-120). Model: the addition demo's
(tiny preset, 4 layers, 8 heads of 16), seq_len 512, batch 16.

Useful tokens are the examples' own tokens (context + completion + end-of-text),
never padding. Each mode's batches are planned once; a first pass compiles every
shape (timed: "compile_s"), then rounds alternate the two modes over the same
batches (steady state), and the ratio is the median over rounds. Prints one JSON
line per mix.

    python benchmarks/packed_training.py --steps 60 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from star_engine.machine import cpu_model  # as lscpu's "Model name"


def mixes(n: int, seed: int) -> dict:
    import numpy as np
    from star_arithmetic import AdditionTask

    from star_haiku_xmap.train import trainer as train
    from star_haiku_xmap.tokenizer import ByteTokenizer

    tok = ByteTokenizer()
    task = AdditionTask(seed=0, n_train=10000, n_dev=250, min_digits=1, max_digits=5, n_seed=1000,
                        seed_max_digits=3, seed_hint_fraction=0.5, n_shots=0)  # experiments/addition.toml
    qs = task.load("train", None)[:n]
    rng = np.random.default_rng(seed)
    cqa = []
    for _ in range(n):
        p, c = int(rng.integers(100, 201)), int(rng.integers(30, 121))
        cqa.append(train.Encoded(rng.integers(1, 256, p + c).astype(np.int32), p))
    return {
        "addition_seed": [train.encode_example(tok, e.prompt, e.completion, 512) for e in task.seed_examples()],
        "addition_iteration": [train.encode_example(tok, task.context(q), task.gold_completion(q, False), 512)
                               for q in qs],
        "cqa_shaped": cqa,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=60, help="optimizer steps timed per mode and round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=16, help="examples per step (training.batch_size)")
    ap.add_argument("--mix", default="addition_seed,addition_iteration,cqa_shaped")
    ap.add_argument("--cpu-devices", type=int, default=1, help="XLA:CPU devices, split as dp")
    a = ap.parse_args(argv)

    import jax

    jax.config.update("jax_num_cpu_devices", a.cpu_devices)
    import numpy as np

    from star_haiku_xmap.model import network as model
    from star_haiku_xmap.runtime import sharding
    from star_haiku_xmap.train import trainer as train
    from star_haiku_xmap.model.config import PRESETS
    from star_haiku_xmap.options import AdamW

    cfg = PRESETS["tiny"].replace(n_layer=4, n_head=8, d_head=16)  # experiments/addition.toml's model
    mesh = sharding.make_mesh({"dp": a.cpu_devices, "mp": 1})
    params = sharding.shard_tree(model.init_params(cfg, 0), mesh)
    tx = AdamW.from_table({"lr": 1e-4, "warmup_steps": 0}).build(10_000)
    put = lambda b: jax.device_put(b, sharding.batch_sharding(mesh, batch_axis=1, ndim=3))
    load = os.getloadavg()
    for name, enc in mixes(1500, 0).items():
        if name not in a.mix.split(","):
            continue
        runs: dict[str, dict[str, Any]] = {}  # mode -> its batches, state, update and timings
        for mode in ("none", "segments"):
            batches = list(train.packing_batches(enc, steps=a.steps, batch_size=a.batch, grad_accum=1, seed=0,
                                                 seq_len=512, pad_id=0, dp=a.cpu_devices, packing=mode,
                                                 loss="completion", config=cfg))
            useful = sum(int((b["segments"] > 0).sum()) for b in batches)
            state = train.init_state(train.master_params(params, "float32"), tx)
            update = train.make_update(cfg, tx, mesh, state)
            shapes = {}
            t0 = time.perf_counter()
            for b in batches:  # compile each shape once (and run it)
                if b["tokens"].shape not in shapes:
                    state, m = update(state, put(b))
                    jax.block_until_ready(m)
                    shapes[b["tokens"].shape] = True
            compile_s = time.perf_counter() - t0
            runs[mode] = {"batches": [put(b) for b in batches], "state": state, "update": update, "useful": useful,
                          "computed": sum(b["tokens"].size for b in batches), "shapes": sorted(shapes),
                          "compile_s": compile_s, "times": []}
        for r in range(a.rounds):
            for mode in (("none", "segments") if r % 2 == 0 else ("segments", "none")):
                run = runs[mode]
                t0 = time.perf_counter()
                for b in run["batches"]:
                    run["state"], m = run["update"](run["state"], b)
                jax.block_until_ready((run["state"], m))
                run["times"].append(time.perf_counter() - t0)
        ratios = [n / s for n, s in zip(runs["none"]["times"], runs["segments"]["times"])]
        out = {"mix": name, "steps": a.steps, "batch": a.batch, "rounds": a.rounds, "cpu_devices": a.cpu_devices,
               "ratio_useful_tokens_per_s": round(float(np.median(ratios)), 3),
               "ratios": [round(x, 3) for x in ratios]}
        for mode, run in runs.items():
            best = min(run["times"])
            out[mode] = {"useful_tokens_per_s": round(run["useful"] / best), "padding_share": round(
                1 - run["useful"] / run["computed"], 3), "shapes": [list(s) for s in run["shapes"]],
                "compile_s": round(run["compile_s"], 1), "step_ms": round(1e3 * best / a.steps, 1)}
        out.update(cpu=cpu_model(), load_before=[round(x, 2) for x in load],
                   load_after=[round(x, 2) for x in os.getloadavg()], jax=jax.__version__)
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
