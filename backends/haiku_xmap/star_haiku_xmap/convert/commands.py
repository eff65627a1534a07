"""``star-engine`` subcommands of the GPT-J backend (registered through ``register_commands``).

- ``star-engine convert``: released GPT-J weights (Hugging Face safetensors, a
  mesh-transformer-jax slim checkpoint) or a native checkpoint into a native
  checkpoint, optionally pre-split for an mp-way mesh, or back into the
  mesh-transformer-jax layout for another number of shards, or a native checkpoint
  out as a Hugging Face folder (``--to hf``: ``hf_export.py``), or a LoRA checkpoint's
  adapters as a Hugging Face peft adapter folder (``--to peft``: ``peft_export.py``).
- ``star-engine plan [EXPERIMENT]``: compile the train and decode steps of an experiment
  (``plan/experiment.py``), or of a model and mesh given by options, with abstract
  parameters and print XLA's per-device memory analysis.

Each command's modules (jax among them) are imported when it runs (``actions.py``, the plan's
``plan/command.py``), never when the plugin is discovered or the CLI lists its commands.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..plan import command as plan_command

DTYPE_CHOICES = ("bfloat16", "float32")


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
            "--to hf the source is a native checkpoint (--from native, the default there). --to peft writes a LoRA "
            "checkpoint's adapters as a peft adapter folder (adapter_config.json, adapter_model.safetensors) that "
            "peft.PeftModel.from_pretrained and vLLM's --enable-lora load over the base model's --to hf export, "
            "named by --base-name.")
        parser.add_argument("src", type=Path, help="source folder; with --from hf also a Hugging Face hub id "
                                                   "(owner/name[@revision], downloaded through huggingface_hub "
                                                   "when no such folder exists here)")
        parser.add_argument("dest", type=Path, nargs="?", default=None,
                            help="destination folder (created; an existing checkpoint is replaced atomically; "
                                 "--to mtj|hf|peft: must not exist). Default with --from hf: checkpoints/NAME in the "
                                 "working directory, NAME the source's last path part in lower case (Qwen/Qwen2.5-1.5B: "
                                 "checkpoints/qwen2.5-1.5b), where the experiment files expect it when run from "
                                 "the repository's root")
        parser.add_argument("--from", dest="source", default=None, choices=("hf", "mtj", "native"),
                            help="required with --to native; --to mtj|hf|peft read a native checkpoint")
        parser.add_argument("--to", dest="target", default="native", choices=("native", "mtj", "hf", "peft"))
        parser.add_argument("--dtype", choices=DTYPE_CHOICES, default=None,
                            help="parameter dtype (default: bfloat16 from hf/mtj, the source's from native and "
                                 "for --to hf and --to peft)")
        parser.add_argument("--max-shard-size", default=None, metavar="SIZE",
                            help="--to hf: largest safetensors file (5GB, 500MiB, bytes); above it the weights are "
                                 "split in shards listed by model.safetensors.index.json (default 5GB)")
        parser.add_argument("--base-name", default=None, metavar="PATH|NAME",
                            help="--to peft (required): the base model as the adapter's users load it (its --to hf "
                                 "folder, or the name vLLM serves it under); adapter_config.json's "
                                 "base_model_name_or_path")
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
        from . import actions  # jax: the CLI lists the commands without loading them

        return actions.convert(args)


class PlanCommand:
    help = ("compile the train and decode steps of an experiment file (or of a model and mesh given by options) "
            "with abstract params and print XLA's per-device memory analysis")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        plan_command.add_arguments(parser)

    def run(self, args: argparse.Namespace) -> int:
        return plan_command.run(args)
