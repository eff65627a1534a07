"""``star-engine`` subcommands of the GPT-J backend (registered through ``register_commands``).

- ``star-engine convert``: released GPT-J weights (Hugging Face safetensors, a
  mesh-transformer-jax slim checkpoint) or a native checkpoint into a native
  checkpoint, optionally pre-split for an mp-way mesh, or back into the
  mesh-transformer-jax layout for another number of shards, or a native checkpoint
  out as a Hugging Face folder (``--to hf``: ``hf_export.py``).
- ``star-engine plan [EXPERIMENT]``: compile the train and decode steps of an experiment
  (``plan/experiment.py``), or of a model and mesh given by options, with abstract
  parameters and print XLA's per-device memory analysis.

Each command's modules (jax among them) are imported when it runs, never when the
plugin is discovered or the CLI lists its commands.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from star_engine import UserError

DTYPE_CHOICES = ("bfloat16", "float32")
MAX_MP = 1024


def _tokenizer_dict(args: argparse.Namespace, default_file: Path | None, stored: dict | None = None) -> dict:
    from ..tokenizer import ByteTokenizer, HFTokenizer  # deferred: the CLI lists the commands without loading them

    if args.byte_tokenizer:
        return ByteTokenizer().to_dict()
    if args.tokenizer_file:
        return HFTokenizer(args.tokenizer_file).to_dict()
    if stored is not None:
        return stored
    if default_file is not None and default_file.is_file():
        from .hf_import import folder_tokenizer

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
    from ..options import HUB_ID

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


class ConvertCommand:
    help = ("convert weights (hf safetensors: GPT-J or Llama/Qwen2/Mistral | mtj slim checkpoint | native) into "
            "a native or mtj checkpoint, or a native checkpoint into a Hugging Face folder")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.description = (
            "Convert model weights, one tensor in memory at a time. Sources: --from hf (a folder with config.json "
            "and model.safetensors or model.safetensors.index.json; .bin/.pt are refused; GPT-J, or Llama / "
            "Qwen2 / Mistral, detected from config.json's model_type), --from mtj (a "
            "mesh-transformer-jax slim checkpoint: shard_*/N.npz), --from native (a checkpoint of this backend). "
            "--to native (default) writes a native checkpoint; with --mp N > 1 its model-parallel leaves are "
            "stored as N parts so that each device of an mp=N mesh reads only its own slice. --to mtj writes "
            "the mesh-transformer-jax slim layout with --mp shards (default 8). --to hf writes a native checkpoint "
            "(GPT-J, Llama, Qwen2, Mistral) as a Hugging Face folder that transformers loads: safetensors, "
            "config.json, generation_config.json, tokenizer.json and tokenizer_config.json. With --to mtj or "
            "--to hf the source is a native checkpoint (--from native, the default there).")
        parser.add_argument("src", type=Path, help="source folder; with --from hf also a Hugging Face hub id "
                                                   "(owner/name[@revision], downloaded through huggingface_hub "
                                                   "when no such folder exists here)")
        parser.add_argument("dest", type=Path, nargs="?", default=None,
                            help="destination folder (created; an existing checkpoint is replaced atomically; "
                                 "--to mtj|hf: must not exist). Default with --from hf: checkpoints/NAME in the "
                                 "working directory, NAME the source's last path part in lower case (Qwen/Qwen2.5-1.5B: "
                                 "checkpoints/qwen2.5-1.5b), where the experiment files expect it when run from "
                                 "the repository's root")
        parser.add_argument("--from", dest="source", default=None, choices=("hf", "mtj", "native"),
                            help="required with --to native; --to mtj|hf read a native checkpoint")
        parser.add_argument("--to", dest="target", default="native", choices=("native", "mtj", "hf"))
        parser.add_argument("--dtype", choices=DTYPE_CHOICES, default=None,
                            help="parameter dtype (default: bfloat16 from hf/mtj, the source's from native and "
                                 "for --to hf)")
        parser.add_argument("--max-shard-size", default=None, metavar="SIZE",
                            help="--to hf: largest safetensors file (5GB, 500MiB, bytes); above it the weights are "
                                 "split in shards listed by model.safetensors.index.json (default 5GB)")
        parser.add_argument("--mp", type=int, default=None, metavar="N",
                            help="--to native: store leaves pre-split for an mp=N mesh (default 1 = unsplit); "
                                 "--to mtj: number of shards (default 8)")
        parser.add_argument("--tokenizer-file", type=Path, default=None,
                            help="a Hugging Face tokenizer.json stored in the checkpoint (default: SRC/tokenizer.json "
                                 "for hf, the stored one for native; required for mtj)")
        parser.add_argument("--byte-tokenizer", action="store_true", help="store the byte tokenizer instead")
        parser.add_argument("--config", default="gptj-6b", metavar="PRESET|FILE.json",
                            help="--from mtj: the model (a preset, or mesh-transformer-jax's JSON config); "
                                 "default gptj-6b")

    def run(self, args: argparse.Namespace) -> int:
        from ..checkpoint.write import write_checkpoint  # deferred: the CLI lists the commands without loading them

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
        if args.target in ("mtj", "hf"):
            if args.source not in (None, "native"):
                raise UserError(f"--to {args.target}: convert to a native checkpoint first (--from native SRC)")
            return self._to_mtj(args, mp or 8) if args.target == "mtj" else self._to_hf(args)
        if args.source is None:
            raise UserError("--from: required (hf, mtj or native)")
        mp = mp or 1
        if args.source == "hf":
            from .hf_import import iter_hf, source_name

            dtype = args.dtype or "bfloat16"
            src = hf_source(src)
            folder = src if src.is_dir() else src.parent
            tok = _tokenizer_dict(args, folder / "tokenizer.json")
            config, leaves = iter_hf(src, dtype=dtype)  # the architecture from config.json's model_type
            extra: dict[str, object] = {"source": source_name(config)}
        elif args.source == "mtj":
            from .mtj_import import iter_mtj_gptj
            from .mtj_layout import resolve_config

            dtype = args.dtype or "bfloat16"
            config = resolve_config(args.config, dtype=dtype)
            tok = _tokenizer_dict(args, None)
            step, leaves = iter_mtj_gptj(src, config)
            extra = {"source": "mtj_slim", "mtj_step": step}
        else:
            from ..config import config_from_dict
            from ..checkpoint.format import native_leaves

            if src.resolve() == dest.resolve():
                raise UserError(f"{dest}: the destination must differ from the source")
            manifest, leaves = native_leaves(src, args.dtype)
            config = config_from_dict(manifest["model_config"])
            if args.dtype:
                config = config.replace(dtype=args.dtype)
            tok = _tokenizer_dict(args, None, stored=manifest["tokenizer"])
            extra = dict(manifest["extra"])
        self._check_vocab(tok, config)
        write_checkpoint(dest, leaves, model_config=config.to_dict(), tokenizer=tok, extra=extra, mp_split=mp)
        split = f", leaves pre-split for mp={mp}" if mp > 1 else ""
        print(f"wrote {dest.resolve()} ({config.n_layer} layers, d_model {config.d_model}, vocab {config.vocab}, "
              f"{config.dtype}{split}); an experiment reads it with [model] checkpoint_path = its path relative "
              f"to the experiment file")
        return 0

    @staticmethod
    def _check_vocab(tok: dict, config) -> None:
        if tok.get("vocab_size", 0) > config.vocab:
            raise UserError(f"the tokenizer has {tok['vocab_size']} tokens, more than the model's vocab {config.vocab}")

    def _to_mtj(self, args: argparse.Namespace, shards: int) -> int:
        from .mtj_export import export_mtj  # deferred: the CLI lists the commands without loading them

        if args.tokenizer_file or args.byte_tokenizer:
            raise UserError("--to mtj: a slim checkpoint stores no tokenizer")
        export_mtj(args.src, args.dest, shards=shards, dtype=args.dtype)
        print(f"wrote {args.dest} (mesh-transformer-jax slim layout, {shards} shards)")
        return 0

    def _to_hf(self, args: argparse.Namespace) -> int:
        from .hf_export import DEFAULT_MAX_SHARD, export_hf, parse_size  # deferred, as above

        if args.mp is not None:
            raise UserError("--to hf: --mp does not apply (a Hugging Face folder is not split for a mesh)")
        max_shard = parse_size(args.max_shard_size) if args.max_shard_size is not None else DEFAULT_MAX_SHARD
        tok = _tokenizer_dict(args, None) if args.tokenizer_file or args.byte_tokenizer else None
        out = export_hf(args.src, args.dest, dtype=args.dtype, max_shard_size=max_shard, tokenizer=tok)
        files = len(out["files"])
        print(f"wrote {args.dest} (Hugging Face {out['architecture']}, {out['tensors']} tensors, {out['dtype']}, "
              f"{out['bytes']} bytes in {files} safetensors file{'s' if files > 1 else ''}, tokenizer files)")
        return 0


class PlanCommand:
    help = ("compile the train and decode steps of an experiment file (or of a model and mesh given by options) "
            "with abstract params and print XLA's per-device memory analysis")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        from ..plan.command import add_arguments  # deferred: the CLI lists the commands without loading them

        add_arguments(parser)

    def run(self, args: argparse.Namespace) -> int:
        from ..plan.command import run  # deferred: the CLI lists the commands without loading them

        return run(args)
