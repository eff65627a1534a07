"""Sampling from the model. Modules are imported by name; nothing is re-exported
(importing this package imports no jax: ``text`` is loaded when the plugin is).

- ``static``: length-sorted static batches, each decoded until its last row ends.
- ``continuous``: continuous batching (a slot whose row has ended takes the next prompt).
- ``slots``: continuous batching's device side (the slots' state; insert and decode, compiled).
- ``text``: text in, text out (prompts tokenized, stop strings cut), over either.
"""
