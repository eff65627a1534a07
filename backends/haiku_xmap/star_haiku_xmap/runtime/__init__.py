"""The runtime: this machine for XLA (``machine``, ``hugepages``), multi-process JAX
(``layout``, ``distributed``, ``coordination``), the mesh and its rule table (``sharding``), the
environment variables read (``envvars``), the weights on the devices (``weights``) and the
backend's jax-using bodies (``engine``). Importing the package imports no jax."""
