"""Generation from a LoRA checkpoint against generation from a plain one, through the
haiku_xmap backend (``star_engine.api.Backend.generate``): the adapters are merged into
the weights when the checkpoint is loaded (``lora.merge``), so the sampler runs the plain
model's compiled program. Prints ONE JSON line.

Sides, alternating per round (ABBA): ``lora`` generates from a LoRA checkpoint (adapters
trained 2 steps over a random base), ``plain`` from the same model written whole (so both
give the same tokens). ``warm``: the model is
already on the devices (as in a run, where the stage that trained it left it cached), so
the time is the sampler's alone; ``cold``: from an empty cache, so loading (for LoRA: the
base, the adapters' files, the merge) is in the time. Ratios are medians of the per-round
ratios (wall time). ``merge_s``: one ``lora.merge`` of the loaded base and adapters.

    python benchmarks/lora_generation.py --layers 6 --requests 200 --new-tokens 96
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_common import cpu_name, threads


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny", help="model preset (random weights)")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    import jax

    from star_engine.api import GenRequest, GenSpec, TrainExample, TrainSpec
    from star_haiku_xmap.model import lora
    from star_haiku_xmap.checkpoint.format import load_checkpoint, read_manifest
    from star_haiku_xmap.plugin import HaikuXmapBackend

    root = Path(tempfile.mkdtemp(prefix="lora-gen-"))
    b = HaikuXmapBackend.from_table(preset=a.preset, n_layer=a.layers, train_checkpoint_minutes=0)
    base = b.base(root, seed=0)
    examples = [TrainExample(f"Q: {i} + {i}\nA:", f" {2 * i}") for i in range(32)]
    opt = {"lr": 1e-3, "warmup_steps": 0}
    adapter = {"kind": "lora", "rank": a.rank}
    adapted = b.train(base, root / "lora", examples, TrainSpec(2, 8, 1, 0, opt, adapter=adapter)).checkpoint
    # The same model as a plain checkpoint (the adapters merged, written whole): both sides then
    # generate the very same tokens, and only how the weights reach the sampler differs.
    plain = str(root / "plain")
    b.save_params(Path(plain), b.load_params(adapted), {"kind": "merged", "from": b.checkpoint_id(adapted)})
    requests = [GenRequest(f"Q: {i} + {i * 7 % 13}\nA:", i) for i in range(a.requests)]
    spec = GenSpec(a.new_tokens, 0.0, 1.0, (), 64)

    outputs: dict[str, list[str]] = {}

    def side(checkpoint, warm: bool):
        b.weights.forget()
        if warm:
            b.load_params(checkpoint)  # on the devices, as a run leaves it after training
        t = time.perf_counter()
        outputs[checkpoint] = b.generate(checkpoint, requests, spec)
        return time.perf_counter() - t

    first = {"plain": side(plain, False), "lora": side(adapted, False)}  # compiles
    times: dict[str, list[float]] = {f"{n}_{m}": [] for n in ("plain", "lora") for m in ("warm", "cold")}
    for r in range(a.rounds):
        for mode in ("warm", "cold"):
            for name in (("plain", "lora") if r % 2 == 0 else ("lora", "plain")):
                times[f"{name}_{mode}"].append(side(plain if name == "plain" else adapted, mode == "warm"))
    ratio = {m: round(statistics.median(x / y for x, y in zip(times[f"lora_{m}"], times[f"plain_{m}"])), 3)
             for m in ("warm", "cold")}
    base_params, _ = load_checkpoint(base)
    adapters, m = load_checkpoint(adapted)
    spec_l = lora.LoraSpec.from_dict(m["extra"]["lora"])
    jax.block_until_ready(lora.merge(base_params, adapters, spec_l))
    t = time.perf_counter()
    jax.block_until_ready(lora.merge(base_params, adapters, spec_l))
    merge_s = time.perf_counter() - t
    print(json.dumps({
        "device": f"cpu: {cpu_name()}" if jax.devices()[0].platform == "cpu" else str(jax.devices()[0]),
        "threads": threads(), "preset": a.preset, "layers": a.layers, "rank": a.rank,
        "requests": a.requests, "new_tokens": a.new_tokens, "rounds": a.rounds,
        "first_call_s": {k: round(v, 3) for k, v in first.items()},
        "median_s": {k: round(statistics.median(v), 3) for k, v in times.items()},
        "lora_over_plain": ratio, "merge_s": round(merge_s, 4), "same_text": outputs[plain] == outputs[adapted],
        "lora_extra": read_manifest(adapted)["extra"]["kind"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
