"""The started runtime: this machine's devices and processes for XLA (``machine``:
``start_runtime``), a multi-process run's checkpoint writes (``distributed``) and the weights on
the devices, loaded, cached and saved (``weights``: ``Weights``). Importing the package imports
no jax."""
