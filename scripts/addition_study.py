#!/usr/bin/env python3
"""Learning curves of the addition demo's base model: what a design choice buys per step.

``star-engine run`` shows accuracy once per STaR iteration; choosing the model shape,
optimizer, batch size and seed mix needs the curve in between. This script trains
the base model of an experiment file exactly as its ``[base_training]`` section says
(same task seed set, backend, model, optimizer and step function: the backend's
``options.AdamW.build`` / ``make_update`` / ``run_steps``), stops every
``--eval-every`` steps and measures on the dev split:

- **teacher-forced digit accuracy** per digit count and digit role (the share of
  digits predicted right given the gold prefix; roles from
  ``star_arithmetic.formats.digit_roles``: ``copy``, ``sum``, ``carry``, ``result``)
  and ``seq``, the share of dev completions predicted right at every position;
- **greedy dev accuracy** per digit count, through the backend's own ``generate``
  and the experiment's checker, as ``star-engine run`` evaluates;
- with ``--hinted``, greedy accuracy with the hint line (what rationalization sees).

Each evaluation is one JSON line: step, loss tokens, the training's wall and CPU
seconds so far (evaluation excluded), the mean loss since the last line, and the
accuracies. ``plot`` draws several such files against steps, loss tokens or CPU
seconds; ``table`` prints one Markdown row per file (docs/addition.md)::

    python scripts/addition_study.py run experiments/addition_from_scratch.toml --steps 1500 --eval-every 250 \\
        --set base_training.optimizer.lr=2e-3 --label lr2e-3 --out /tmp/study/lr2e-3.jsonl
    python scripts/addition_study.py plot /tmp/study/*.jsonl --x cpu --out /tmp/study/curves.png
    python scripts/addition_study.py table /tmp/study/*.jsonl

Differences from the engine's base training, by design: the step plan is drawn per
segment (seed, segment) instead of once, so batches differ from the run's (same
distribution); evaluation costs are kept out of the timings.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any
from collections.abc import Sequence

import numpy as np

from star_arithmetic.formats import digit_roles
from star_engine.api import GenRequest, GenSpec
from star_engine.config.load import load_experiment
from star_engine.run.experiment import build
from star_engine.config.registry import Registry
from star_engine.run.stages import derive_seed

TF_BATCH = 50


# ----------------------------------------------------------------------------- measuring


def teacher_forced(backend, params, task, dev) -> dict[str, dict[str, float]]:
    """{digit count: {role: accuracy}} given the gold prefix. Roles: those of
    ``digit_roles``; ``seq``, the share of completions right at every token; and
    ``sum=a`` / ``sum=b``, the share of sum digits predicted as a copy of the
    column's digit of a or of b (the failure mode before the digit sum is learned)."""
    import jax
    import jax.numpy as jnp

    from star_haiku_xmap.model import network as model
    from star_haiku_xmap.train import trainer as train

    tok = backend.tokenizer
    if type(tok).__name__ != "ByteTokenizer":
        raise SystemExit("addition_study: teacher-forced digit roles need the byte tokenizer (one token per byte)")
    rows = []
    for ex in dev:
        completion = task.gold_completion(ex, direct=False)
        enc = train.encode_example(tok, task.context(ex), completion, backend.seq_len)
        rows.append((ex, enc, digit_roles(completion)))
    T = max(len(enc.ids) for _, enc, _ in rows)
    hits: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))

    def count(cls: str, what: str, ok: bool) -> None:
        hits[cls][what][0] += int(ok)
        hits[cls][what][1] += 1

    for start in range(0, len(rows), TF_BATCH):
        chunk = rows[start:start + TF_BATCH]
        tokens = np.full((TF_BATCH, T), tok.pad_id, np.int32)
        mask = np.zeros((TF_BATCH, T), bool)
        for b, (_, enc, _) in enumerate(chunk):
            tokens[b, :len(enc.ids)], mask[b, :len(enc.ids)] = enc.ids, True
        logits = model.forward(params, jnp.asarray(tokens), backend.config, mask=jnp.asarray(mask))
        pred = np.asarray(jax.device_get(jnp.argmax(logits, axis=-1)))  # pred[t] is the guess for token t + 1
        for b, (ex, enc, roles) in enumerate(chunk):
            ids, n0 = enc.ids, enc.n_prompt
            guess = pred[b, n0 - 1:len(ids) - 1]  # for every completion token (and end-of-text)
            for offset, role in roles:
                count(ex.cls, role, guess[offset] == ids[n0 + offset])
            count(ex.cls, "seq", bool((guess == ids[n0:]).all()))
            columns = {name: str(ex.fields[name])[::-1] for name in ("a", "b")}
            for k, offset in enumerate(o for o, role in roles if role == "sum"):
                for name, digits in columns.items():
                    count(ex.cls, f"sum={name}", k < len(digits) and guess[offset] == tok.encode(digits[k])[0])
    return {cls: {role: h / n for role, (h, n) in by.items()} for cls, by in hits.items()}


def greedy(exp, checkpoint: str, dev, hinted: bool, batch_size: int) -> dict[str, float]:
    """Greedy accuracy per digit count through the backend's generate and the experiment's checker."""
    task, backend = exp.task, exp.backend
    prompts = [task.prompt("hint") + exp.hint.context(task, ex) if hinted else task.prompt("rationale") + task.context(ex)
               for ex in dev]
    max_new = exp.config.evaluation.max_new_tokens or exp.config.generation.max_new_tokens
    spec = GenSpec(max_new, 0.0, 1.0, tuple(task.stop), batch_size)
    texts = backend.generate(checkpoint, [GenRequest(p, 0) for p in prompts], spec)
    right: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for ex, text in zip(dev, texts):
        right[ex.cls][0] += bool(exp.checker.check(text, task.extract(text), ex.answer).correct)
        right[ex.cls][1] += 1
    return {cls: h / n for cls, (h, n) in right.items()}


def overall(per_class: dict[str, float], dev) -> float:
    counts: defaultdict[str, int] = defaultdict(int)
    for ex in dev:
        counts[ex.cls] += 1
    return sum(per_class[c] * n for c, n in counts.items()) / sum(counts.values())


def measure(args: argparse.Namespace) -> None:
    import jax

    from star_haiku_xmap.runtime import sharding
    from star_haiku_xmap.train import trainer as train
    from star_haiku_xmap.checkpoint import format as ckpt
    from star_haiku_xmap.checkpoint import write as ckpt_write
    from star_haiku_xmap.options import AdamW
    from star_haiku_xmap.plugin import HaikuXmapBackend

    registry = Registry()
    exp = build(load_experiment(Path(args.experiment), args.set, registry=registry), registry)
    if args.hinted and not exp.config.rationalization.enabled:
        raise SystemExit("addition_study: --hinted needs rationalization enabled (the hint formatter)")
    task, backend = exp.task, exp.backend
    if not isinstance(backend, HaikuXmapBackend):  # its tokenizer, mesh and trainer are the haiku_xmap backend's
        raise SystemExit(f"addition_study: needs model.backend = \"haiku_xmap\", not {exp.config.model['backend']!r}")
    bt, seed = exp.config.base_training, exp.config.experiment.seed
    optimizer = bt.optimizer.as_dict()
    steps = args.steps or bt.steps
    dev = exp.splits["dev"][: args.dev_limit or None]
    seeds = task.seed_examples()
    encoded = [train.encode_example(backend.tokenizer, e.prompt, e.completion, backend.seq_len) for e in seeds]
    work = Path(tempfile.mkdtemp(prefix="addition-study-"))
    # The run's own initial weights (same seed, same backend.base), as star-engine starts from them.
    init = backend.base(work / "base", seed) if not args.init else args.init
    params = sharding.shard_tree(ckpt.load_checkpoint(init)[0], backend.mesh)
    tx = AdamW.from_table(optimizer).build(steps)
    state = train.init_state(train.master_params(params, backend.options.master_dtype), tx)
    update = train.make_update(backend.config, tx, backend.mesh, state)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    header = {"label": args.label or out.stem, "experiment": args.experiment, "set": args.set, "steps": steps,
              "seed_examples": len(seeds), "batch_size": bt.batch_size, "grad_accum": bt.grad_accum,
              "optimizer": optimizer, "model": backend.config.to_dict(), "dev": len(dev)}
    lines = [json.dumps({"header": header})]
    done = tokens = 0
    wall = cpu = 0.0
    while done < steps:
        k = min(args.eval_every, steps - done)
        t0, c0 = time.perf_counter(), time.process_time()
        batches = train.packing_batches(
            encoded, config=backend.config, steps=k, batch_size=bt.batch_size, grad_accum=bt.grad_accum,
            seed=derive_seed(seed, 0, "base_training", done), seq_len=backend.seq_len,
            pad_id=backend.tokenizer.pad_id, dp=sharding.dp_size(backend.mesh), packing=bt.packing,
            loss=bt.loss)
        state, losses, n_tok = train.run_steps(update, state, batches, mesh=backend.mesh)
        loss = float(np.mean(jax.device_get(losses)))
        wall, cpu = wall + time.perf_counter() - t0, cpu + time.process_time() - c0
        done, tokens = done + k, tokens + n_tok
        row: dict[str, Any] = {"step": done, "loss_tokens": tokens, "train_wall_s": round(wall, 2),
                               "train_cpu_s": round(cpu, 2), "loss": loss}
        e0 = time.perf_counter()
        row["tf"] = teacher_forced(backend, state.params, task, dev)
        path = work / f"step-{done}"
        ckpt_write.save_checkpoint(path, state.params, model_config=backend.config.to_dict(),
                             tokenizer=backend.tokenizer.to_dict(), extra={"kind": "study", "step": done})
        if not args.tf_only:
            row["greedy"] = greedy(exp, str(path), dev, False, args.gen_batch)
            row["greedy_all"] = overall(row["greedy"], dev)
        if args.hinted:
            row["hinted"] = greedy(exp, str(path), dev, True, args.gen_batch)
        row["eval_wall_s"] = round(time.perf_counter() - e0, 2)
        lines.append(json.dumps(row))
        out.write_text("\n".join(lines) + "\n")
        print(summary_line(row), flush=True)
    if args.save:
        ckpt_write.save_checkpoint(args.save, state.params, model_config=backend.config.to_dict(),
                             tokenizer=backend.tokenizer.to_dict(), extra={"kind": "study", "step": done})


def summary_line(row: dict) -> str:
    classes = sorted(row["tf"], key=int)

    def per(what: str) -> str:
        return (f" | {what} " + " ".join(f"{c}:{100 * row[what][c]:.0f}" for c in classes)) if what in row else ""

    tf = " ".join(f"{c}:{100 * row['tf'][c]['sum']:.0f}" for c in classes)
    return (f"step {row['step']:5d}  loss {row['loss']:.4f}  cpu {row['train_cpu_s']:7.1f}s  tf-sum {tf}"
            + per("greedy") + (f" (all {100 * row['greedy_all']:.1f})" if "greedy_all" in row else "") + per("hinted"))


# ----------------------------------------------------------------------------- reading results


def read(path: str) -> tuple[dict, list[dict]]:
    lines = [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
    if not lines or "header" not in lines[0]:
        raise SystemExit(f"{path}: not an addition_study output (no header line)")
    return lines[0]["header"], lines[1:]


X_AXES = {"steps": ("step", "optimizer steps"), "tokens": ("loss_tokens", "loss tokens"),
          "cpu": ("train_cpu_s", "training CPU seconds")}


def plot(args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key, xlabel = X_AXES[args.x]
    runs = [read(p) for p in args.files]
    classes = sorted({c for _, rows in runs for r in rows for c in r["tf"]}, key=int)
    panels = [("greedy", c) for c in classes] + [("tf-sum", c) for c in classes]
    fig, axes = plt.subplots(2, len(classes), figsize=(3.2 * len(classes), 6.4), sharex=True, sharey=True,
                             squeeze=False)
    for (what, c), ax in zip(panels, axes.flat):
        for (header, rows), color in zip(runs, matplotlib.color_sequences["tab10"]):
            x = [r[key] for r in rows]
            y = [100 * (r.get("greedy", {}).get(c, np.nan) if what == "greedy" else r["tf"].get(c, {}).get("sum", np.nan))
                 for r in rows]
            ax.plot(x, y, ".-", color=color, label=header["label"])
        ax.set(title=f"{c} digit{'s' if c != '1' else ''}: {what}", ylim=(0, 100))
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel(xlabel)
    axes[0][0].set_ylabel("greedy dev accuracy (%)")
    axes[1][0].set_ylabel("teacher-forced sum digits (%)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(args.out)


def table(args: argparse.Namespace) -> None:
    print("| design | steps | loss tokens | train CPU s | tf sum digit (1-5) | greedy dev (1-5) | greedy all |")
    print("| --- | ---: | ---: | ---: | --- | --- | ---: |")
    for path in args.files:
        header, rows = read(path)
        if not rows:
            continue
        r = rows[-1]
        classes = sorted(r["tf"], key=int)
        tf = " / ".join(f"{100 * r['tf'][c]['sum']:.0f}" for c in classes)
        gr = " / ".join(f"{100 * r['greedy'][c]:.0f}" for c in classes) if "greedy" in r else "–"
        everything = f"{100 * r['greedy_all']:.1f}" if "greedy_all" in r else "–"
        print(f"| {header['label']} | {r['step']} | {r['loss_tokens']:,} | {r['train_cpu_s']:.0f} | {tf} | {gr} | "
              f"{everything} |")


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="train a base model and write its learning curve (JSON lines)")
    r.add_argument("experiment", help="an addition experiment file (its [task], [model] and [base_training])")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="as star-engine run --set")
    r.add_argument("--steps", type=int, default=0, help="total steps (default: base_training.steps)")
    r.add_argument("--eval-every", type=int, default=250)
    r.add_argument("--dev-limit", type=int, default=0, help="evaluate on the first N dev questions (0 = all)")
    r.add_argument("--gen-batch", type=int, default=125, help="generation batch size")
    r.add_argument("--hinted", action="store_true", help="also greedy accuracy with the hint line")
    r.add_argument("--tf-only", action="store_true", help="teacher-forced accuracy only (no greedy generation)")
    r.add_argument("--init", default="", help="start from this checkpoint instead of the run's initial weights")
    r.add_argument("--save", default="", help="write the final weights to this checkpoint directory")
    r.add_argument("--label", default="")
    r.add_argument("--out", required=True)
    r.set_defaults(func=measure)
    pl = sub.add_parser("plot", help="greedy and teacher-forced sum-digit curves of several runs")
    pl.add_argument("files", nargs="+")
    pl.add_argument("--x", choices=sorted(X_AXES), default="steps")
    pl.add_argument("--out", required=True)
    pl.set_defaults(func=plot)
    t = sub.add_parser("table", help="one Markdown row per run (its last evaluation)")
    t.add_argument("files", nargs="+")
    t.set_defaults(func=table)
    args = p.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
