"""The Llama family's side of the HF import (``hf_import.py`` reads the files) and export
(``hf_export.py``): ``config.json`` of ``model_type`` llama, qwen2 or mistral to a ``LlamaConfig``
and back, and the tensor names.

Name mapping (HF -> haiku; every matrix transposed from (out, in) to (in, out))::

    model.embed_tokens.weight                          wte/embeddings
    model.layers.{i}.input_layernorm.weight            h_{i}/ln_attn/scale
    model.layers.{i}.post_attention_layernorm.weight   h_{i}/ln_mlp/scale
    model.layers.{i}.self_attn.{q,k,v}_proj.weight     h_{i}/attn/{q,k,v}/w
    model.layers.{i}.self_attn.{q,k,v}_proj.bias       h_{i}/attn/{q,k,v}/b   (Qwen2)
    model.layers.{i}.self_attn.o_proj.weight           h_{i}/attn/out/w
    model.layers.{i}.mlp.{gate,up,down}_proj.weight    h_{i}/mlp/{gate,up,down}/w
    model.norm.weight                                  ln_f/scale
    lm_head.weight                                     lm_head/w   (untied models)

Both spellings of the rotary settings are read: ``rope_theta`` + ``rope_scaling``
(the config.json files on the Hub) and ``rope_parameters`` (transformers 5).
What the model cannot express is refused by name: another activation, MLP or
output-projection biases, rope types other than default and llama3, a sliding
window on some layers only.
"""

from __future__ import annotations

import re
from typing import Any

from star_engine import UserError

from ..model.config import LlamaConfig

MODEL_TYPES = ("llama", "qwen2", "mistral")
_ROTARY_BUFFER = r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq"


def _rope(hf: dict, where: str) -> tuple[float, tuple[float, float, float, int] | None]:
    params = hf.get("rope_parameters")
    if params is None:
        params = dict(hf.get("rope_scaling") or {})
        params.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
    if not isinstance(params, dict):
        raise UserError(f"{where}: rope_parameters must be an object, got {params!r}")
    kind = params.get("rope_type", params.get("type", "default"))
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    if kind in (None, "default"):
        return theta, None
    if kind != "llama3":
        raise UserError(f"{where}: rope type {kind!r} is not supported (only 'default' and 'llama3')")
    try:
        return theta, tuple(params[k] for k in ("factor", "low_freq_factor", "high_freq_factor",
                                                "original_max_position_embeddings"))
    except KeyError as exc:
        raise UserError(f"{where}: llama3 rope scaling without {exc.args[0]!r}") from None


def _window(hf: dict, where: str) -> int | None:
    kinds = set(hf.get("layer_types") or ())
    if hf.get("model_type") == "qwen2":
        if not hf.get("use_sliding_window", False) and "sliding_attention" not in kinds:
            return None
        if kinds != {"sliding_attention"} and hf.get("max_window_layers", 0) < hf.get("num_hidden_layers", 0):
            raise UserError(f"{where}: a sliding window on some layers only (max_window_layers) is not supported")
    elif kinds - {"full_attention", "sliding_attention"} or len(kinds) > 1:
        raise UserError(f"{where}: layer_types {sorted(kinds)} mix attention kinds; not supported")
    if kinds == {"full_attention"}:
        return None
    return hf.get("sliding_window")


def config_from_hf(hf: dict, *, dtype: str = "float32", where: str = "config.json") -> LlamaConfig:
    """LlamaConfig for an HF llama / qwen2 / mistral ``config.json`` dict."""
    def need(key: str) -> Any:
        if key not in hf:
            raise UserError(f"{where}: missing key {key!r}")
        return hf[key]

    kind = hf.get("model_type")
    if kind not in MODEL_TYPES:
        raise UserError(f"{where}: model_type is {kind!r}, expected one of {', '.join(MODEL_TYPES)}")
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise UserError(f"{where}: hidden_act {act!r} is not supported (only 'silu')")
    for key in ("attention_bias", "mlp_bias"):
        if hf.get(key, False):
            raise UserError(f"{where}: {key} true is not supported (output-projection/MLP biases)")
    d_model, n_head = need("hidden_size"), need("num_attention_heads")
    if not isinstance(d_model, int) or not isinstance(n_head, int) or n_head <= 0:
        raise UserError(f"{where}: hidden_size {d_model!r} / num_attention_heads {n_head!r} must be ints")
    head_dim = hf.get("head_dim") or (d_model // n_head if d_model % n_head == 0 else None)
    if head_dim is None:
        raise UserError(f"{where}: hidden_size {d_model} is not a multiple of num_attention_heads {n_head} "
                        "and head_dim is not given")
    theta, scaling = _rope(hf, where)
    try:
        return LlamaConfig(n_layer=need("num_hidden_layers"), d_model=d_model, n_head=n_head,
                           n_kv_head=hf.get("num_key_value_heads") or n_head, d_head=head_dim,
                           d_ff=need("intermediate_size"), n_ctx=need("max_position_embeddings"),
                           vocab=need("vocab_size"), rms_eps=float(hf.get("rms_norm_eps", 1e-6)),
                           rope_theta=float(theta), rope_scaling=scaling, qkv_bias=kind == "qwen2",
                           tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
                           sliding_window=_window(hf, where), dtype=dtype)
    except (TypeError, ValueError) as exc:
        raise UserError(f"{where}: {exc}") from None


def hf_name(key_path: tuple[str, ...]) -> tuple[str, bool]:
    """HF tensor name for a haiku key path, and whether it is transposed."""
    module, leaf = "/".join(key_path[:-1]), key_path[-1]
    if module == "wte":
        return "model.embed_tokens.weight", False
    if module == "ln_f":
        return "model.norm.weight", False
    if module == "lm_head":
        return "lm_head.weight", True
    m = re.fullmatch(r"h_(\d+)/(ln_attn|ln_mlp|attn/(q|k|v|out)|mlp/(gate|up|down))", module)
    if not m:
        raise UserError(f"no HF name for parameter {'/'.join(key_path)}")
    base = f"model.layers.{m.group(1)}"
    if m.group(2) in ("ln_attn", "ln_mlp"):
        return f"{base}.{'input' if m.group(2) == 'ln_attn' else 'post_attention'}_layernorm.weight", False
    if m.group(3):
        proj = "o" if m.group(3) == "out" else m.group(3)
        return f"{base}.self_attn.{proj}_proj.{'weight' if leaf == 'w' else 'bias'}", leaf == "w"
    return f"{base}.mlp.{m.group(4)}_proj.weight", True


def ignored(config: LlamaConfig) -> re.Pattern:
    """Tensors some exports carry that the model does not use: rotary buffers, and
    a copy of the embedding as ``lm_head.weight`` when the two are tied."""
    tied = r"|lm_head\.weight" if config.tie_embeddings else ""
    return re.compile(f"^({_ROTARY_BUFFER}{tied})$")


# ----------------------------------------------------------------------------- export (hf_export.py)


def model_type(config: LlamaConfig) -> str:
    """The HF ``model_type`` a config is exported as: qwen2 (q/k/v biases), mistral (a
    sliding window) or llama."""
    return "qwen2" if config.qkv_bias else "mistral" if config.sliding_window else "llama"


def config_json(config: LlamaConfig, head: dict[str, Any], tail: dict[str, Any], where: str) -> dict[str, Any]:
    """``config.json`` of ``config`` between ``head`` (architectures, model_type, vocab_size)
    and ``tail`` (ids, dtype) fields."""
    kind = head["model_type"]
    scaling = None
    if config.rope_scaling is not None:
        factor, low, high, original = config.rope_scaling
        scaling = {"rope_type": "llama3", "factor": float(factor), "low_freq_factor": float(low),
                   "high_freq_factor": float(high), "original_max_position_embeddings": int(original)}
    out = {**head, "hidden_size": config.d_model, "intermediate_size": config.d_ff,
           "num_hidden_layers": config.n_layer, "num_attention_heads": config.n_head,
           "num_key_value_heads": config.n_kv_head, "head_dim": config.d_head, "hidden_act": "silu",
           "max_position_embeddings": config.n_ctx, "rms_norm_eps": config.rms_eps,
           "rope_theta": float(config.rope_theta), "rope_scaling": scaling,
           "tie_word_embeddings": config.tie_embeddings, "attention_dropout": 0.0}
    window = config.sliding_window
    if kind == "llama":
        out.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    elif kind == "mistral":
        out.update(sliding_window=window)
    else:  # Qwen2: the window (if any) on every layer; layer_types says so to transformers 5
        out.update(use_sliding_window=window is not None, sliding_window=window,
                   max_window_layers=0 if window else config.n_layer,
                   layer_types=["sliding_attention" if window else "full_attention"] * config.n_layer)
    return {**out, **tail}
