"""The native checkpoint format, which every run reads and writes. Modules are
imported by name; nothing is re-exported.

- ``format``: the format (manifest, msgpack/zstd parts) and its verifying reader.
- ``write``: the writer (atomic publish).
- ``safeio``: bounded readers for untrusted files (msgpack, zstd parts, safetensors headers, JSON).
"""
