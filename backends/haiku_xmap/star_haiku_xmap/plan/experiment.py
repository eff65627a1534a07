"""``star-engine plan EXPERIMENT.toml``: the memory plan of what an experiment will run.

The experiment is read as ``run`` reads it (``star_engine.config.load.load_experiment``: its
``--set`` overrides, the backend's defaults; no data is loaded) and planned with
``plan.plan_one``:

- the model: the checkpoint's config (``model.checkpoint_path``'s manifest) when it is there,
  else the preset (``model.preset``, default "tiny", "llama-tiny" for ``architecture =
  "llama"``) with the ``[model]`` field overrides, in ``model.dtype``;
- the mesh ``model.mesh`` (``dp = -1``, all devices, is planned as one replica: dp 1, the
  most each device can need), ``zero``, ``opt_state_dtype``, ``master_dtype``,
  ``grad_accum_dtype``, ``remat``;
- the train step of ``[training]``: ``batch_size`` x ``grad_accum`` of ``model.seq_len``
  (default the context) tokens, with its LoRA ``adapter`` when it has one; with ``--what``
  ``base`` / ``verifier``, the step of ``[base_training]`` (when its ``steps`` > 0) and the
  verifier's DPO step (``batch_size`` pairs, their chosen and rejected rows, when
  ``[verifier] enabled``), each with its own shape and adapter (``SECTIONS``);
- the sampler of ``[generation]``: ``batch_size`` rows of the longest prompt the backend keeps
  (the context less ``max_new_tokens``) and ``max_new_tokens`` new tokens.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, NamedTuple

from star_engine import Registry, UserError
from star_engine.helpers import is_int, load_experiment

from ..checkpoint.format import MANIFEST, read_manifest
from ..model.config import PRESETS, config_from_dict, preset
from ..model.lora import check_table
from ..options import check_generation, missing_checkpoint

# The plan options an experiment decides, as (flag, args attribute).
DECIDED = (("--preset", "preset"), ("--n-layer", "n_layer"), ("--dtype", "dtype"), ("--mesh", "mesh"),
           ("--zero", "zero"), ("--opt-state-dtype", "opt_state_dtype"), ("--master-dtype", "master_dtype"),
           ("--grad-accum-dtype", "grad_accum_dtype"), ("--remat", "remat"), ("--batch", "batch"),
           ("--grad-accum", "grad_accum"), ("--seq-len", "seq_len"), ("--gen-batch", "gen_batch"),
           ("--prompt-len", "prompt_len"), ("--new-tokens", "new_tokens"), ("--standard", "standard"),
           ("--models", "models"))


def model_config(model: dict[str, Any]) -> tuple[Any, str]:
    """The model ``[model]`` describes and where it came from (the checkpoint, or the preset)."""

    fields = ("n_layer", "d_model", "n_head", "d_head", "d_ff", "rotary_dim", "n_ctx", "n_kv_head", "vocab")
    overrides = {k: model.get(k) for k in fields}
    path = model.get("checkpoint_path") or ""
    name = model.get("preset")
    if path and (Path(path) / MANIFEST).is_file():
        config = config_from_dict(read_manifest(path)["model_config"])
        config = config.replace(**{k: v for k, v in overrides.items() if v is not None})
        where = f"the checkpoint {path}"
    else:
        if path and not name:
            missing = missing_checkpoint(path, model.get("hub_id") or "", model.get("mesh"),
                                         model.get("checkpoint_sha256") or "")
            raise UserError(f"model.checkpoint_path: {missing}; model.preset does not say which model it will be "
                            f"either: --set model.preset=... plans a preset instead", key="model.checkpoint_path")
        name = name or ("llama-tiny" if model.get("architecture") == "llama" else "tiny")
        if name not in PRESETS:
            raise UserError(f"model.preset: unknown preset {name!r}; known: {sorted(PRESETS)}", key="model.preset")
        try:
            config = preset(name, **overrides)
        except (TypeError, ValueError) as e:
            raise UserError(f"model: {e}") from None
        where = f"preset {name!r}" + (f" ({path} is not converted yet)" if path else "")
    if model.get("dtype"):
        config = config.replace(dtype=model["dtype"])
    return config, where


def _mesh(model: dict[str, Any]) -> tuple[int, int, str]:
    mesh = model.get("mesh") or {"dp": -1, "mp": 1}
    if not isinstance(mesh, dict) or set(mesh) - {"dp", "mp"}:
        raise UserError(f"model.mesh: must be a table like {{dp = 1, mp = 8}}, got {mesh!r}", key="model.mesh")
    dp, mp = mesh.get("dp", -1), mesh.get("mp", 1)
    if not all(is_int(x) for x in (dp, mp)) or mp < 1 or (dp < 1 and dp != -1):
        raise UserError(f"model.mesh: dp >= 1 (or -1: every device) and mp >= 1, got {mesh!r}", key="model.mesh")
    return (1, mp, " (dp = -1: every device; planned as one replica)") if dp == -1 else (dp, mp, "")


class Step(NamedTuple):
    """A train program of ``--what``: the section whose step it is, its objective, its name in the
    plan, and the key of that section that decides whether the run takes it at all (with a value
    that makes it) -- None: always."""

    section: str
    objective: str
    label: str
    switch: tuple[str, str] | None = None


SECTIONS = {"train": Step("training", "tokens", ""), "base": Step("base_training", "tokens", "[base_training]",
                                                                   ("steps", "100")),
            "verifier": Step("verifier", "dpo", "[verifier]", ("enabled", "true"))}


def runs(cfg: dict[str, Any], step: Step) -> bool:
    """Whether the experiment takes ``step`` at all (its switch is not 0 or false)."""
    return step.switch is None or bool(cfg[step.section][step.switch[0]])


def unplanned(cfg: dict[str, Any], what: tuple[str, ...]) -> list[str]:
    """The ``--what`` names of the train steps the experiment runs and ``what`` leaves out."""
    return [w for w, step in SECTIONS.items() if w not in what and runs(cfg, step)]


def load(args: argparse.Namespace) -> dict[str, Any]:
    """The experiment ``args.experiment`` with ``args.overrides``, as ``run`` loads it, as the
    plain tables ``config.json`` holds (``Config.as_dict``)."""
    given = [flag for flag, attr in DECIDED if getattr(args, attr, None) not in (None, False)]
    if given:
        raise UserError(f"{given[0]}: not with an experiment file, which decides it (change the experiment with "
                        f"--set, e.g. --set model.mesh='{{dp = 1, mp = 8}}')")
    return load_experiment(args.experiment, args.overrides, None, Registry()).as_dict()


def job(args: argparse.Namespace, what: str = "train",
        cfg: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any], str]:
    """(model config, ``plan_one``'s keyword arguments, a line saying what is planned) for the
    experiment ``args.experiment`` with ``args.overrides`` (``cfg``: it, loaded already); the
    train step is ``what``'s (``SECTIONS``: "train" is ``[training]``'s)."""

    cfg = load(args) if cfg is None else cfg
    step = SECTIONS[what]
    section, objective, label = step.section, step.objective, step.label
    model, tr, g = cfg["model"], cfg[section], cfg["generation"]
    if not runs(cfg, step) and step.switch is not None:
        key, value = step.switch
        raise UserError(f"--what: {what}: the experiment runs no {label} step ([{section}] {key} is "
                        f"{str(tr[key]).lower()}); plan it with --set {section}.{key}={value}")
    if model.get("backend") != "haiku_xmap":
        raise UserError(f"{args.experiment}: model.backend is {model.get('backend')!r}; plan plans the haiku_xmap "
                        f"backend's programs")
    config, where = model_config(model)
    dp, mp, note = _mesh(model)
    seq_len = model.get("seq_len") or config.n_ctx
    if not isinstance(seq_len, int) or not 2 <= seq_len <= config.n_ctx:
        raise UserError(f"model.seq_len: must be an int in [2, n_ctx={config.n_ctx}], got {seq_len!r}",
                        key="model.seq_len")
    new_tokens = g["max_new_tokens"]
    check_generation("generation", new_tokens, config.n_ctx)  # as validate_run checks it
    adapter = None
    if tr["adapter"]:
        adapter = check_table({k: v for k, v in tr["adapter"].items()}, config, f"{section}.adapter")
    kw = dict(dp=dp, mp=mp, zero=model.get("zero", 0), opt_state_dtype=model.get("opt_state_dtype", "float32"),
              master_dtype=model.get("master_dtype", "float32"), accum_dtype=model.get("grad_accum_dtype", "float32"),
              remat=bool(model.get("remat", False)), batch=tr["batch_size"], grad_accum=tr["grad_accum"],
              seq_len=seq_len, gen_batch=g["batch_size"], prompt_len=config.n_ctx - new_tokens,
              new_tokens=new_tokens, adapter=adapter, objective=objective, section=label)
    unit = " pairs" if objective == "dpo" else ""
    line = (f"# {args.experiment}: {where}, {config.n_layer} layers, d_model {config.d_model}, {config.dtype}; "
            f"mesh {dp}x{mp}{note}; [{section}] {tr['batch_size']}{unit} x {tr['grad_accum']} x {seq_len} tokens"
            f"{', LoRA r=' + str(adapter.rank) if adapter else ''}; [generation] {g['batch_size']} x "
            f"({config.n_ctx - new_tokens} + {new_tokens}) tokens")
    return config, kw, line
