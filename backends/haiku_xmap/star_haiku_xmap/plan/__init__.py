"""``star-engine plan``: the compiled memory plan for a mesh. Modules are imported by
name; nothing is re-exported.

- ``memory``: compiling a train step and a sampler abstractly and reading XLA's memory analysis.
- ``command``: the command's options, the standard table and a single plan.
- ``models``: ``plan --models``, the table of docs/models.md.
- ``experiment``: ``plan EXPERIMENT.toml``, the shapes an experiment file decides.
- ``table``: the tables' units and spellings (jax-free, as ``command`` and ``models``).
"""
