"""File formats, weight conversion and the backend's ``star-engine`` subcommands, apart
from the model, training and sampling. Modules are imported by name; nothing is re-exported.

- ``safeio``: bounded readers for untrusted files (msgpack, zstd parts, safetensors headers).
- ``checkpoint``: native checkpoints, written atomically and verified on load.
- ``hf_import``: Hugging Face safetensors folders to native parameters (GPT-J mapping included).
- ``hf_llama``: the Llama family's HF config and tensor names.
- ``mtj_import``: mesh-transformer-jax slim checkpoints, in and out.
- ``commands``: ``star-engine convert`` and ``star-engine plan``.
- ``plan``: the compiled memory plan for a mesh (``star-engine plan``).
- ``plan_models``: ``plan --models``, the table of docs/models.md.
"""
