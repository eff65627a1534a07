"""The plan table of docs/models.md: today's open models (Qwen2.5-0.5B / 1.5B,
Llama-3.2-1B / 3B, Llama-3.1-8B) on one 80 GiB GPU and on TPU v3-8 / v4-8
meshes, each with the first training settings that fit; and LoRA (r = 32 on every
projection, the bf16 base frozen, fp32 adapters and moments) for Llama-3.1-8B,
Mistral-7B and GPT-J-6B on one 80 GiB GPU.

``star-engine plan --models`` compiles (``memory.plan_one``) each model's train
step and sampler at ``--fit-layers`` depths (default 2 and 4 layers) and
extrapolates XLA's per-device bytes linearly to the model's depth: the blocks
are identical, so arguments and outputs grow by exactly one block's share per
layer, and temporaries by the activations one more block keeps. A whole-depth
compile of a 6B-class train step takes minutes on a small CPU; ``--full`` compiles
the real depth instead (what ``plan --preset NAME`` does), and docs/models.md
shows one such row beside its extrapolation as a check.

Training settings are tried in order, leanest last, until one fits:
fp32 master weights, moments and gradient accumulator; then bf16 moments; then
bf16 moments and accumulator; then bf16 master weights too; then the same with
per-layer remat (see docs/gptj6b.md for what each costs in fidelity).
"""

from __future__ import annotations

import argparse
import json

from star_engine import UserError

from ..model.config import preset
from .table import GIB, short, yes

FULL = ("qwen2.5-0.5b", "qwen2.5-1.5b", "llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b")
LORA = ("llama-3.1-8b+lora", "mistral-7b+lora", "gptj-6b+lora")  # LoRA r = 32 on every projection, frozen bf16 base
MODELS = FULL + LORA
LORA_TABLE = {"kind": "lora", "rank": 32, "alpha": 64}
# (name, dp, mp, GiB per device): a TPU v3-8 is 8 cores of 16 GiB, a v4-8 4 chips of 32 GiB.
TARGETS = (("1 GPU (80 GiB)", 1, 1, 80.0), ("TPU v3-8", 1, 8, 16.0), ("TPU v4-8", 1, 4, 32.0))
# (master, moments, gradient accumulator, remat), most faithful first.
# Remat comes last: XLA:CPU's plan keeps more temporaries with it, not fewer (docs/gptj6b.md §4).
LADDER = (("float32", "float32", "float32", False), ("float32", "bfloat16", "float32", False),
          ("float32", "bfloat16", "bfloat16", False), ("bfloat16", "bfloat16", "bfloat16", False),
          ("bfloat16", "bfloat16", "bfloat16", True))
FIELDS = ("argument", "output", "alias", "temp")


def extrapolate(shallow: dict, deep: dict, layers: tuple[int, int], target: int) -> dict:
    """Each byte count of ``shallow``/``deep`` (compiled at ``layers``) continued
    linearly to ``target`` layers; ``peak`` recomputed."""
    (a, b) = layers
    out = dict(deep)
    for f in FIELDS:
        per_layer = (deep[f] - shallow[f]) / (b - a)
        out[f] = int(round(deep[f] + per_layer * (target - b)))
    out["peak"] = out["argument"] + out["output"] - out["alias"] + out["temp"]
    out["layers"] = target
    return out


def _one(config, layers: tuple[int, int] | None, **kw) -> dict:
    from .memory import plan_one  # jax: this module loads with the CLI (its options), jax when a plan runs

    if layers is None:
        return plan_one(config=config, **kw)[0]
    shallow, deep = (plan_one(config=config.replace(n_layer=n), **kw)[0] for n in layers)
    return extrapolate(shallow, deep, layers, config.n_layer)


def plan_model(name: str, target: tuple, args: argparse.Namespace, layers: tuple[int, int] | None) -> list[dict]:
    """The sampler's row and the first training settings that fit (else the smallest peak) for one model and
    target."""
    from ..model.lora import check_table  # jax (haiku), as _one

    label, dp, mp, gib = target
    config = preset(name.removesuffix("+lora"), dtype="bfloat16")
    adapter = check_table(LORA_TABLE, config, "lora") if name.endswith("+lora") else None
    common = dict(dp=dp, mp=mp, zero=0, batch=args.batch, grad_accum=args.grad_accum, seq_len=args.seq_len,
                  gen_batch=args.gen_batch, prompt_len=args.prompt_len, new_tokens=args.new_tokens)
    rows = []
    # LoRA: fp32 adapters and moments; only remat is tried on top (the adapters' state is small).
    ladder = LADDER if adapter is None else (("float32", "float32", "float32", False),
                                             ("float32", "float32", "float32", True))
    for master, moments, accum, remat in ladder:
        r = _one(config, layers, what=("train",), opt_state_dtype=moments, master_dtype=master, accum_dtype=accum,
                 remat=remat, adapter=adapter, **common)
        rows.append(r)
        if r["peak"] <= gib * GIB:
            break
    train = rows[-1] if rows[-1]["peak"] <= gib * GIB else min(rows, key=lambda r: r["peak"])
    sample = _one(config, layers, what=("sample",), opt_state_dtype="bfloat16", **common)
    tag = {"model": name, "target": label, "device_gib": gib, "tried": len(rows),
           "extrapolated_from": list(layers) if layers else None}
    return [{**tag, **r, "fits": r["peak"] <= gib * GIB} for r in (train, sample)]


HEADER = ("| model | target (mesh) | program | master | moments | grad accum | remat | shape | arguments GiB | "
          "temporaries GiB | peak GiB | device GiB | fits |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")


def _row(r: dict) -> str:
    g = lambda b: f"{b / GIB:.2f}"
    return (f"| {r['model']} | {r['target']} ({r['mesh']}) | {r['program'].split(' (')[0]} | "
            f"{short(r['master_dtype'])} | {short(r['opt_state_dtype'])} | {short(r['accum_dtype'])} | "
            f"{yes(r['remat'])} | {r['shape']} | {g(r['argument'])} | {g(r['temp'])} | {g(r['peak'])} | "
            f"{r['device_gib']:g} | {'yes' if r['fits'] else 'NO'} |")


def run_models(args: argparse.Namespace) -> int:
    from .memory import setup_devices  # jax, as _one

    models = args.models.split(",") if args.models != "all" else list(MODELS)
    lora_targets = [t for t in TARGETS if t[1] * t[2] == 1]  # LoRA rows: the one-GPU target
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise UserError(f"--models: unknown {unknown}; known: {', '.join(MODELS)} (or all)")
    targets = [t for t in TARGETS if args.targets == "all" or t[0] in args.targets.split(",")]
    if not targets:
        raise UserError(f"--targets: none of {[t[0] for t in TARGETS]}")
    try:
        layers = None if args.full else tuple(int(x) for x in args.fit_layers.split(","))
    except ValueError:
        raise UserError(f"--fit-layers: two layer counts like 2,4, got {args.fit_layers!r}") from None
    if layers is not None and (len(layers) != 2 or not 1 <= layers[0] < layers[1]):
        raise UserError(f"--fit-layers: two increasing layer counts like 2,4, got {args.fit_layers!r}")
    setup_devices(max(dp * mp for _, dp, mp, _ in targets), args.platform)
    if not args.json:
        print(HEADER)
    for name in models:
        for target in (targets if name in FULL else [t for t in targets if t in lora_targets]):
            for r in plan_model(name, target, args, layers):
                print(json.dumps(r) if args.json else _row(r), flush=True)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default=None, metavar="all|NAME,...",
                        help="the table of docs/models.md: these Llama-family presets on the GPU and TPU targets, "
                             f"each with the first training settings that fit ({', '.join(MODELS)}; +lora: LoRA r = 32 on "
                             "one GPU)")
    parser.add_argument("--targets", default="all", help="--models: comma-separated target names, or all")
    parser.add_argument("--fit-layers", default="2,4", help="--models: the two depths compiled and extrapolated")
    parser.add_argument("--full", action="store_true", help="--models: compile at the model's real depth")

