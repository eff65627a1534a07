"""Export a native checkpoint as a mesh-transformer-jax slim checkpoint (the layout:
``mtj_layout.py``).

``export_mtj`` writes the same layout from a native checkpoint, one leaf at a
time: embedding bias zero (already folded into ``wte``), fc_out's bias on shard
0 and zero elsewhere, so that importing the export gives back the native
parameters bit for bit.
"""

from __future__ import annotations

import os
import shutil
import zipfile
from pathlib import Path

import numpy as np
from numpy.lib import format as npy_format

from star_engine import UserError
from star_engine.helpers import fsync_dir, temporary_sibling

from ..model.config import GPTJConfig
from ..checkpoint.format import checked_manifest, read_leaf
from .mtj_layout import leaf_layout, piece_sizes, shard_slices
from ..checkpoint.safeio import make_parents, np_dtype, remove_created


def _write_member(zf: zipfile.ZipFile, index: int, arr: np.ndarray) -> None:
    arr = np.asarray(arr)
    if not arr.flags.c_contiguous:
        arr = arr.copy(order="C")  # (np.ascontiguousarray would turn the 0-d step into shape (1,))
    if arr.dtype == np_dtype("bfloat16"):
        arr = arr.view(np.dtype("V2"))  # how mesh-transformer-jax stores bf16
    with zf.open(f"arr_{index}.npy", "w", force_zip64=True) as f:
        npy_format.write_array(f, arr, allow_pickle=False)


def export_mtj(checkpoint: str | os.PathLike, dest: str | os.PathLike, *, shards: int = 8,
               dtype: str | None = None, step: int = 0) -> None:
    """Write native checkpoint ``checkpoint`` as a mesh-transformer-jax slim
    checkpoint with ``shards`` model-parallel shards at ``dest`` (a new folder,
    written to a temporary sibling and renamed). One native leaf in memory at a time."""
    src = Path(checkpoint)
    m = checked_manifest(src)
    if m["model_config"].get("architecture", "gptj") != "gptj":
        raise UserError(f"{src}: --to mtj writes GPT-J only; this checkpoint is {m['model_config']['architecture']!r}")
    config = GPTJConfig.from_dict(m["model_config"])
    if dtype is not None:
        config = config.replace(dtype=dtype)
    layout = leaf_layout(config, shards)
    entries = {tuple(e["path"]): e for e in m["leaves"]}
    dest = Path(dest)
    if dest.exists():
        raise UserError(f"{dest}: exists; refusing to overwrite")
    created = make_parents(dest)  # taken away again if the export fails
    tmp = temporary_sibling(dest)
    tmp.mkdir()
    target = np_dtype(config.dtype)
    try:
        for s in range(shards):
            (tmp / f"shard_{s}").mkdir()
        start = 0
        for piece, count in enumerate(piece_sizes(len(layout))):
            zips = [zipfile.ZipFile(tmp / f"shard_{s}" / f"{piece}.npz", "w", zipfile.ZIP_STORED, allowZip64=True)
                    for s in range(shards)]
            try:
                for j, leaf in enumerate(layout[start:start + count]):
                    if leaf.native is None:
                        slices = [np.asarray(step, np.int32)] * shards
                    elif leaf.native == ("wte", "bias"):
                        slices = [np.zeros(leaf.shard_shape, target)] * shards
                    else:
                        value = read_leaf(src, entries[leaf.native])
                        if value.dtype != target:
                            value = value.astype(np.float32).astype(target)
                        slices = shard_slices(leaf, value, shards)
                        del value
                    for zf, part in zip(zips, slices):
                        _write_member(zf, j, part)
                    del slices
            finally:
                for zf in zips:
                    zf.close()
            start += count
        for s in range(shards):
            for f in (tmp / f"shard_{s}").iterdir():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
            fsync_dir(tmp / f"shard_{s}")
        fsync_dir(tmp)
        os.rename(tmp, dest)
        fsync_dir(dest.parent)  # the rename itself survives a power cut
        created = []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        remove_created(created)

