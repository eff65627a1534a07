"""``convert/peft_export.py``: a LoRA checkpoint written as a Hugging Face peft adapter folder.

Without torch: for GPT-J, Llama and a Qwen2-like model (q/k/v biases, tied embeddings), random
adapters with nonzero B over a random base, exported both merged (``export_hf``) and as an
adapter (``export_peft``): for every target of every layer, the base export's weight plus
scale * lora_B @ lora_A is the merged export's weight (fp32), the tensor names are the base
export's module paths under ``base_model.model.``; ``adapter_config.json``'s fields; bf16; ``convert --to peft``; the
refusals (not a LoRA checkpoint, an existing destination, a bad dtype) and a failed export
leaving nothing behind. Slow, with peft and torch: ``PeftModel.from_pretrained`` over the base
export computes the merged export's logits."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from star_engine import UserError
from star_engine.cli import main
from star_haiku_xmap.checkpoint import format as C
from star_haiku_xmap.checkpoint import write as CW
from star_haiku_xmap.checkpoint.safeio import read_safetensors_header
from star_haiku_xmap.convert import peft_export
from star_haiku_xmap.convert.hf_export import export_hf
from star_haiku_xmap.convert.peft_export import export_peft
from star_haiku_xmap.model import lora
from star_haiku_xmap.model import network as model
from star_haiku_xmap.model.config import PRESETS, architecture
from star_haiku_xmap.tokenizer import ByteTokenizer

MODELS = {"gptj": PRESETS["tiny"].replace(n_layer=2, n_ctx=64),
          "llama": PRESETS["llama-tiny"].replace(n_ctx=64),
          "qwen2": PRESETS["llama-tiny"].replace(n_ctx=64, qkv_bias=True, tie_embeddings=True)}
# (rank, alpha, targets (None: all), rslora)
ADAPTERS = {"gptj": (4, 8.0, None, False), "llama": (4, 6.5, ["q_proj", "o_proj", "down_proj"], True),
            "qwen2": (2, 16.0, ["k_proj", "v_proj", "gate_proj", "up_proj"], False)}


def make_lora(root: Path, family: str) -> tuple[Path, Path, lora.LoraSpec]:
    """A random base checkpoint and a LoRA checkpoint over it (A and B random, B nonzero) as a
    LoRA stage writes one: (base, adapters, spec)."""
    config = MODELS[family]
    base, ck = root / f"{family}_base", root / f"{family}_run" / "model"
    CW.save_checkpoint(base, model.init_params(config, 0), model_config=config.to_dict(),
                       tokenizer=ByteTokenizer().to_dict())
    rank, alpha, targets, rslora = ADAPTERS[family]
    spec = lora.LoraSpec(rank, alpha, tuple(targets or lora.TARGETS[architecture(config)]), rslora)
    rng = np.random.default_rng(1)
    adapters = {path: {"lora_a": rng.normal(0, 0.2, shape).astype(np.float32)}
                for (path, name), (shape, _) in lora.adapter_specs(config, spec).items() if name == "lora_a"}
    for (path, name), (shape, _) in lora.adapter_specs(config, spec).items():
        if name == "lora_b":
            adapters[path]["lora_b"] = rng.normal(0, 0.2, shape).astype(np.float32)
    ck.parent.mkdir(parents=True)
    CW.save_checkpoint(ck, adapters, model_config=config.to_dict(), tokenizer=ByteTokenizer().to_dict(),
                       extra={"kind": "lora", "lora": spec.to_dict(), "base": C.manifest_sha256(base),
                              "base_path": os.path.relpath(base.resolve(), ck.resolve())},
                       specs=lora.adapter_specs(config, spec))
    return base, ck, spec


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, dict]:
    """{family: {base, ck, spec, hf_base, hf_merged, peft, summary}}."""
    root = tmp_path_factory.mktemp("peft_export")
    out = {}
    for family in MODELS:
        base, ck, spec = make_lora(root, family)
        export_hf(base, root / f"{family}_hf_base")
        export_hf(ck, root / f"{family}_hf_merged")
        summary = export_peft(ck, root / f"{family}_peft", base_name=str(root / f"{family}_hf_base"))
        out[family] = {"base": base, "ck": ck, "spec": spec, "hf_base": root / f"{family}_hf_base",
                       "hf_merged": root / f"{family}_hf_merged", "peft": root / f"{family}_peft",
                       "summary": summary}
    return out


@pytest.mark.parametrize("family", list(MODELS))
def test_base_plus_peft_delta_is_the_merged_export(family, exported):
    e = exported[family]
    base = load_file(e["hf_base"] / "model.safetensors")
    merged = load_file(e["hf_merged"] / "model.safetensors")
    adapter = load_file(e["peft"] / "adapter_model.safetensors")
    spec = e["spec"]
    config = MODELS[family]
    want_names = set()
    for module in lora.module_paths(config, spec):
        hf = peft_export.hf_module(architecture(config), module)
        a, b = adapter[f"base_model.model.{hf}.lora_A.weight"], adapter[f"base_model.model.{hf}.lora_B.weight"]
        w = base[f"{hf}.weight"]
        assert a.shape == (spec.rank, w.shape[1]) and b.shape == (w.shape[0], spec.rank)
        got = w.astype(np.float64) + spec.scale * (b.astype(np.float64) @ a.astype(np.float64))
        np.testing.assert_allclose(got, merged[f"{hf}.weight"], atol=2e-5, rtol=0)
        assert np.abs(merged[f"{hf}.weight"] - w).max() > 1e-2  # the adapters do change the weight
        want_names |= {f"base_model.model.{hf}.lora_A.weight", f"base_model.model.{hf}.lora_B.weight"}
    assert set(adapter) == want_names
    assert len(want_names) == 2 * config.n_layer * len(spec.targets) == e["summary"]["tensors"]
    untouched = set(base) - {f"{peft_export.hf_module(architecture(config), m)}.weight" for m in lora.module_paths(config, spec)}
    assert all(np.array_equal(base[k], merged[k]) for k in untouched)


@pytest.mark.parametrize("family", list(MODELS))
def test_adapter_config(family, exported):
    e = exported[family]
    cfg = json.loads((e["peft"] / "adapter_config.json").read_text())
    rank, alpha, targets, rslora = ADAPTERS[family]
    names = {"gptj": ["q_proj", "k_proj", "v_proj", "out_proj", "fc_in", "fc_out"]}
    assert cfg["peft_type"] == "LORA" and cfg["task_type"] == "CAUSAL_LM"
    assert cfg["r"] == rank and cfg["lora_alpha"] == alpha and cfg["use_rslora"] is rslora
    assert cfg["target_modules"] == (targets or names[family])
    assert isinstance(cfg["lora_alpha"], int) == alpha.is_integer()
    assert cfg["lora_dropout"] == 0.0 and cfg["bias"] == "none" and cfg["fan_in_fan_out"] is False
    assert cfg["inference_mode"] is True and cfg["use_dora"] is False and cfg["modules_to_save"] is None
    assert cfg["base_model_name_or_path"] == str(e["hf_base"])
    assert sorted(p.name for p in e["peft"].iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    s = e["summary"]
    assert s["files"] == ["adapter_config.json", "adapter_model.safetensors"] and s["dtype"] == "float32"
    assert (s["r"], s["alpha"], s["target_modules"]) == (rank, alpha, cfg["target_modules"])
    header, metadata = read_safetensors_header(e["peft"] / "adapter_model.safetensors")
    assert metadata == {"format": "pt"}
    assert s["bytes"] == sum(int(np.prod(t.shape)) * 4 for t in header.values())


def test_bf16_export(exported, tmp_path):
    e = exported["llama"]
    s = export_peft(e["ck"], tmp_path / "bf16", base_name="meta-llama/whatever", dtype="bfloat16")
    header, _ = read_safetensors_header(tmp_path / "bf16" / "adapter_model.safetensors")
    assert {t.dtype for t in header.values()} == {"bfloat16"} and s["dtype"] == "bfloat16"
    assert s["bytes"] == exported["llama"]["summary"]["bytes"] // 2


def test_refusals(exported, tmp_path):
    e = exported["gptj"]
    with pytest.raises(UserError, match="not a LoRA checkpoint"):
        export_peft(e["base"], tmp_path / "a", base_name="x")
    with pytest.raises(UserError, match="not a checkpoint"):
        export_peft(tmp_path, tmp_path / "b", base_name="x")
    with pytest.raises(UserError, match="exists; refusing"):
        export_peft(e["ck"], e["peft"], base_name="x")
    with pytest.raises(UserError, match="--dtype"):
        export_peft(e["ck"], tmp_path / "c", base_name="x", dtype="float16")
    with pytest.raises(UserError, match="--base-name"):
        export_peft(e["ck"], tmp_path / "d", base_name=" ")
    assert list(tmp_path.iterdir()) == []


def test_a_failed_export_leaves_nothing(exported, tmp_path, monkeypatch):
    calls = []
    real = peft_export.read_leaf

    def failing(src, leaf):
        calls.append(leaf["path"])
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(src, leaf)

    monkeypatch.setattr(peft_export, "read_leaf", failing)
    dest = tmp_path / "new" / "deeper" / "peft"
    with pytest.raises(OSError, match="No space left"):
        export_peft(exported["llama"]["ck"], dest, base_name="x")
    assert len(calls) == 3 and list(tmp_path.iterdir()) == []  # no folder, no temporary, no parents


def test_convert_to_peft_command(exported, tmp_path, capsys):
    e = exported["qwen2"]
    assert main(["convert", "--to", "peft", str(e["ck"]), str(tmp_path / "p"), "--base-name", "Qwen/x"]) == 0
    assert "peft LoRA adapter: r 2, alpha 16" in capsys.readouterr().out
    assert json.loads((tmp_path / "p" / "adapter_config.json").read_text())["base_model_name_or_path"] == "Qwen/x"
    for args, message in [([], "--base-name: required"), (["--base-name", "x", "--mp", "2"], "--mp does not apply"),
                          (["--base-name", "x", "--from", "hf"], "convert to a native checkpoint first"),
                          (["--base-name", "x", "--byte-tokenizer"], "stores no tokenizer")]:
        assert main(["convert", "--to", "peft", str(e["ck"]), str(tmp_path / "q"), *args]) == 2
        assert message in capsys.readouterr().err
    assert main(["convert", "--to", "hf", str(e["ck"]), str(tmp_path / "q"), "--base-name", "x"]) == 2
    assert "--base-name: only with --to peft" in capsys.readouterr().err and not (tmp_path / "q").exists()


@pytest.mark.slow
@pytest.mark.parametrize("family", list(MODELS))
def test_peft_model_computes_the_merged_models_logits(family, exported):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    e = exported[family]
    merged = transformers.AutoModelForCausalLM.from_pretrained(e["hf_merged"], dtype=torch.float32).eval()
    base = transformers.AutoModelForCausalLM.from_pretrained(e["hf_base"], dtype=torch.float32)
    adapted = peft.PeftModel.from_pretrained(base, e["peft"]).eval()
    assert adapted.peft_config["default"].r == e["spec"].rank
    tokens = torch.tensor([[3, 17, 99, 256, 42, 7, 200, 1]])
    with torch.no_grad():
        want = merged(tokens).logits
        got = adapted(tokens).logits
    assert float((got - want).abs().max()) <= 1e-4
    with torch.no_grad(), adapted.disable_adapter():
        plain = adapted(tokens).logits
    assert float((plain - want).abs().max()) > 1e-3  # the adapter is what makes them equal
