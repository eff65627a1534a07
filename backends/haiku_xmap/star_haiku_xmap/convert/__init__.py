"""Import and export of weights, and the backend's ``star-engine`` subcommands (the native
checkpoint format is ``star_haiku_xmap.checkpoint``, the plan command
``star_haiku_xmap.plan``). Modules are imported by name; nothing is re-exported.

- ``hf_import``: Hugging Face safetensors folders to native parameters (GPT-J mapping included).
- ``hf_llama``: the Llama family's HF config and tensor names (import and export).
- ``mtj_layout``: mesh-transformer-jax slim checkpoints' layout and its mapping to native parameters.
- ``mtj_import``: reading a slim checkpoint into native parameters.
- ``mtj_export``: writing a native checkpoint as a slim checkpoint.
- ``hf_export``: writing a native checkpoint as a Hugging Face folder (``convert --to hf``).
- ``peft_export``: writing a LoRA checkpoint's adapters as a peft adapter folder (``convert --to peft``).
- ``commands``: ``star-engine convert`` and ``star-engine plan``.
"""
