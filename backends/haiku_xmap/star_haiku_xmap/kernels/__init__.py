"""Kernels of the backend's own, outside XLA's programs: ``ragged`` (decode attention that reads each
row's cache to its own length, ``model.decode_attention = "ragged"``)."""
