"""What the runtime is made of, below the model: the process layout and mesh axes (``layout``),
the mesh and its rule table (``sharding``), the processes' heartbeat and barriers
(``coordination``), huge pages for XLA:CPU (``hugepages``) and the environment variables read
(``envvars``). Importing the package imports no jax."""
