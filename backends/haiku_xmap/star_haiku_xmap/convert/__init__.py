"""File formats, weight conversion and the backend's ``star-engine`` subcommands, apart
from the model, training and sampling. Modules are imported by name; nothing is re-exported.

- ``safeio``: bounded readers for untrusted files (msgpack, zstd parts, safetensors headers, JSON).
- ``checkpoint``: the native checkpoint format and its verifying reader.
- ``checkpoint_write``: the native checkpoint writer (atomic publish).
- ``hf_import``: Hugging Face safetensors folders to native parameters (GPT-J mapping included).
- ``hf_llama``: the Llama family's HF config and tensor names.
- ``mtj_layout``: mesh-transformer-jax slim checkpoints' layout and its mapping to native parameters.
- ``mtj_import``: reading a slim checkpoint into native parameters.
- ``mtj_export``: writing a native checkpoint as a slim checkpoint.
- ``hf_export``: writing a native checkpoint as a Hugging Face folder (``convert --to hf``).
- ``commands``: ``star-engine convert`` and ``star-engine plan``.
- ``plan``: the compiled memory plan for a mesh (``star-engine plan``).
- ``plan_models``: ``plan --models``, the table of docs/models.md.
"""
