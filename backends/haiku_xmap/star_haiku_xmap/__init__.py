"""GPT-J backend for star-engine: dm-haiku model, (dp, mp) mesh sharding, AdamW
training with masked loss, KV-cache sampling. Registered as backend ``haiku_xmap``.

Submodules are imported lazily by their users so that ``import star_haiku_xmap``
stays cheap (the plugin module pulls in jax only when a backend is built).
"""

__version__ = "0.1.0"
