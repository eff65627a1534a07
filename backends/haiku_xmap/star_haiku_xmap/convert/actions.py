"""The bodies of ``star-engine convert`` (``commands.ConvertCommand``: its arguments), imported
when the command runs: the tokenizer stored, the hub download of a Hugging Face id
(``hf_source``; ``huggingface_hub`` only then), and the converters by source and target."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from star_engine import UserError

from ..checkpoint.format import native_leaves
from ..checkpoint.write import write_checkpoint
from ..model.config import config_from_dict
from ..options import HUB_ID
from ..tokenizer import ByteTokenizer, HFTokenizer
from .hf_export import DEFAULT_MAX_SHARD, export_hf, parse_size
from .hf_import import folder_tokenizer, iter_hf, source_name
from .mtj_export import export_mtj
from .mtj_import import convert_mtj_gptj
from .mtj_layout import resolve_config
from .peft_export import export_peft

MAX_MP = 1024  # --mp


def tokenizer_dict(args: argparse.Namespace, default_file: Path | None, stored: dict | None = None) -> dict:
    if args.byte_tokenizer:
        return ByteTokenizer().to_dict()
    if args.tokenizer_file:
        return HFTokenizer(args.tokenizer_file).to_dict()
    if stored is not None:
        return stored
    if default_file is not None and default_file.is_file():
        return folder_tokenizer(default_file.parent, default_file).to_dict()  # eos from config.json
    if default_file is not None:  # a Hugging Face folder of any architecture without its tokenizer
        raise UserError(f"{default_file.parent}: no tokenizer.json in this Hugging Face folder; pass --tokenizer-file "
                        f"(the model's tokenizer.json) or --byte-tokenizer")
    raise UserError("--tokenizer-file: required (GPT-J's tokenizer.json; see docs/gptj6b.md), "
                    "or --byte-tokenizer for a byte-level model")


def default_destination(src: str) -> Path:
    """``checkpoints/<name>``: the source's last path part (a folder's, or a hub id's without
    its revision) in lower case, relative to the working directory."""
    name = Path(src.split("@", 1)[0].rstrip("/")).name.lower()
    if not name or name in (".", ".."):
        raise UserError(f"dest: required (no folder name can be made from {src!r})")
    return Path("checkpoints") / name


def hf_source(src: Path) -> Path:
    """The local folder (or file) ``src`` names; a hub id (``owner/name[@revision]``) that names
    nothing here is downloaded (safetensors, JSON and tokenizer files only) through
    ``huggingface_hub`` into its cache, and that snapshot's folder returned."""
    if src.exists() or not HUB_ID.fullmatch(str(src)):
        return src  # a path: iter_hf names what is wrong with it
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise UserError(f"{src}: no such folder here; to download it as a hub id, install huggingface_hub "
                        f"(python3 -m pip install huggingface_hub)") from None
    repo, _, revision = str(src).partition("@")
    print(f"downloading {repo}{f' at {revision}' if revision else ''} from the Hugging Face hub "
          f"(safetensors, JSON and tokenizer files) ...", flush=True)
    try:
        folder = snapshot_download(repo, revision=revision or None,
                                   allow_patterns=["*.safetensors", "*.json", "tokenizer*"])
    except Exception as e:  # noqa: BLE001 - offline, unknown repo, gated model, disk: one line, its words
        said = " ".join(str(e).split())[:300] or type(e).__name__
        raise UserError(f"{src}: no such folder here, and the hub download failed: {said}") from None
    return Path(folder)


def convert(args: argparse.Namespace) -> int:
    """``star-engine convert`` (``ConvertCommand``: its arguments)."""
    mp = args.mp
    if mp is not None and not 1 <= mp <= MAX_MP:
        raise UserError(f"--mp: must be in [1, {MAX_MP}], got {mp}")
    if args.tokenizer_file is not None and args.byte_tokenizer:
        raise UserError("--tokenizer-file and --byte-tokenizer exclude each other")
    src, dest = args.src, args.dest
    if dest is None:
        if args.source != "hf" or args.target != "native":
            raise UserError("dest: required (the default destination is only for --from hf)")
        dest = default_destination(str(src))
    if args.max_shard_size is not None and args.target != "hf":
        raise UserError("--max-shard-size: only with --to hf")
    if args.base_name is not None and args.target != "peft":
        raise UserError("--base-name: only with --to peft")
    if args.target in ("mtj", "hf", "peft"):
        if args.source not in (None, "native"):
            raise UserError(f"--to {args.target}: convert to a native checkpoint first (--from native SRC)")
        if args.target == "mtj":
            return to_mtj(args, mp or 8)
        return to_hf(args) if args.target == "hf" else to_peft(args)
    if args.source is None:
        raise UserError("--from: required (hf, mtj or native)")
    mp = mp or 1
    if args.source == "hf":
        dtype = args.dtype or "bfloat16"
        src = hf_source(src)
        folder = src if src.is_dir() else src.parent
        tok = tokenizer_dict(args, folder / "tokenizer.json")
        config, leaves = iter_hf(src, dtype=dtype)  # the architecture from config.json's model_type
        extra: dict[str, object] = {"source": source_name(config)}
    elif args.source == "mtj":
        dtype = args.dtype or "bfloat16"
        config = resolve_config(args.config, dtype=dtype)
        tok = tokenizer_dict(args, None)
        check_vocab(tok, config)
        convert_mtj_gptj(src, dest, config=config, tokenizer=tok, mp_split=mp)
        return wrote(dest, config, mp)
    else:
        if src.resolve() == dest.resolve():
            raise UserError(f"{dest}: the destination must differ from the source")
        manifest, leaves = native_leaves(src, args.dtype)
        config = config_from_dict(manifest["model_config"])
        if args.dtype:
            config = config.replace(dtype=args.dtype)
        tok = tokenizer_dict(args, None, stored=manifest["tokenizer"])
        extra = dict(manifest["extra"])
    check_vocab(tok, config)
    write_checkpoint(dest, leaves, model_config=config.to_dict(), tokenizer=tok, extra=extra, mp_split=mp)
    return wrote(dest, config, mp)


def wrote(dest: Path, config: Any, mp: int) -> int:
    """Say what ``convert`` wrote; its exit code."""
    split = f", leaves pre-split for mp={mp}" if mp > 1 else ""
    print(f"wrote {dest.resolve()} ({config.n_layer} layers, d_model {config.d_model}, vocab {config.vocab}, "
          f"{config.dtype}{split}); an experiment reads it with [model] checkpoint_path = its path relative "
          f"to the experiment file")
    return 0


def check_vocab(tok: dict, config: Any) -> None:
    if tok.get("vocab_size", 0) > config.vocab:
        raise UserError(f"the tokenizer has {tok['vocab_size']} tokens, more than the model's vocab {config.vocab}")


def to_mtj(args: argparse.Namespace, shards: int) -> int:
    """``convert --to mtj``."""
    if args.tokenizer_file or args.byte_tokenizer:
        raise UserError("--to mtj: a slim checkpoint stores no tokenizer")
    export_mtj(args.src, args.dest, shards=shards, dtype=args.dtype)
    print(f"wrote {args.dest} (mesh-transformer-jax slim layout, {shards} shards)")
    return 0


def to_hf(args: argparse.Namespace) -> int:
    """``convert --to hf``."""
    if args.mp is not None:
        raise UserError("--to hf: --mp does not apply (a Hugging Face folder is not split for a mesh)")
    max_shard = parse_size(args.max_shard_size) if args.max_shard_size is not None else DEFAULT_MAX_SHARD
    tok = tokenizer_dict(args, None) if args.tokenizer_file or args.byte_tokenizer else None
    out = export_hf(args.src, args.dest, dtype=args.dtype, max_shard_size=max_shard, tokenizer=tok)
    files = len(out["files"])
    print(f"wrote {args.dest} (Hugging Face {out['architecture']}, {out['tensors']} tensors, {out['dtype']}, "
          f"{out['bytes']} bytes in {files} safetensors file{'s' if files > 1 else ''}, tokenizer files)")
    return 0




def to_peft(args: argparse.Namespace) -> int:
    """``convert --to peft``."""
    if args.mp is not None:
        raise UserError("--to peft: --mp does not apply (an adapter folder is not split for a mesh)")
    if args.tokenizer_file or args.byte_tokenizer:
        raise UserError("--to peft: an adapter folder stores no tokenizer (the base model's export has it)")
    if args.base_name is None:
        raise UserError("--base-name: required with --to peft (the base model's --to hf folder or hub name)")
    out = export_peft(args.src, args.dest, base_name=args.base_name, dtype=args.dtype)
    print(f"wrote {args.dest} (peft LoRA adapter: r {out['r']}, alpha {out['alpha']:g}, "
          f"{', '.join(out['target_modules'])}; {out['tensors']} tensors, {out['dtype']}, {out['bytes']} bytes) "
          f"over base {out['base_model_name_or_path']}")
    return 0
