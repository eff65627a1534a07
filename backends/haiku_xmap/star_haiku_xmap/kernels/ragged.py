"""Decode attention that reads each row's cache only to its own length, on a CPU: an XLA FFI
custom call (``ragged_decode.cc``, compiled on first use) for ``model.decode_attention =
"ragged"``.

Dense decode attention (``layers.gqa_attention``) reads every slot of every row's cache each
step, masked or not: in continuous batching every row reads up to the longest live row (1.78x
the slots the rows' own lengths need on the addition demo's workload, docs/performance.md
§3.8), and XLA programs cannot read less (a slice of the slot axis is copied first; a loop
over key blocks costs twice the dense step). The kernel reads, for each row, its cache up to
its last allowed slot, and a shared prefix's keys once per row.

Numerics: fp32 in a fixed order (``ragged_decode.cc``), not XLA's: a row's logits differ from
the dense path's by rounding (~1e-7 relative), so greedy tokens can differ where two logits
nearly tie. The same machine gives the same tokens run after run, and the arithmetic does not
depend on the CPU's vector width (no FMA contraction).

The library is built with the system's C++ compiler (``CXX``, else ``c++``) against jaxlib's
FFI headers into ``STAR_HAIKU_XMAP_KERNEL_CACHE`` (default ``$XDG_CACHE_HOME/star-engine/
kernels``, i.e. ``~/.cache/star-engine/kernels``), keyed by the source, the compiler, jaxlib
and the CPU, written to a temporary name and renamed (a killed build leaves nothing behind). It
runs one thread a device: on a CPU mesh of one device a core (the default) the dp shards run
side by side.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from importlib.resources import files
from pathlib import Path

import jax
import jax.numpy as jnp

from star_engine import UserError

from ..runtime.envvars import star_cache_dir

TARGET = "star_ragged_decode"
CACHE_ENV = "STAR_HAIKU_XMAP_KERNEL_CACHE"
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-std=c++17", "-shared", "-fPIC")


def source() -> bytes:
    return files(__package__).joinpath("ragged_decode.cc").read_bytes()


def _compiler() -> str:
    cxx = os.environ.get("CXX", "").strip() or "c++"
    path = shutil.which(cxx)
    if path is None:
        raise UserError(f"model.decode_attention: 'ragged' compiles a C++ kernel on first use and no C++ "
                        f"compiler was found ({cxx!r}; set CXX or install g++), or use 'dense'",
                        key="model.decode_attention")
    return path


def _cpu_id() -> str:
    """What -march=native compiles for: the machine, and the CPU's model and flags where Linux says."""
    try:
        info = Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
    except OSError:
        info = []
    lines = [line for line in info if line.startswith(("model name", "flags", "Features"))][:2]
    return platform.machine() + "\n" + "\n".join(lines)


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV, "").strip() or star_cache_dir("kernels"))


@functools.cache
def library() -> Path:
    """The compiled kernel: built once per source, compiler, jaxlib and CPU, then reused."""
    cxx = _compiler()
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    src = source()
    key = hashlib.sha256(b"\0".join([src, version.encode(), " ".join(FLAGS).encode(),
                                     jax.__version__.encode(), _cpu_id().encode()])).hexdigest()[:24]
    folder = cache_dir()
    out = folder / f"ragged_decode-{key}.so"
    if out.exists():
        return out
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{CACHE_ENV}: cannot create {folder} for the ragged decode kernel ({e.strerror})") from None
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        cc, so = Path(tmp) / "ragged_decode.cc", Path(tmp) / "ragged_decode.so"
        cc.write_bytes(src)
        done = subprocess.run([cxx, *FLAGS, "-I", jax.ffi.include_dir(), str(cc), "-o", str(so)],
                              capture_output=True, text=True)
        if done.returncode:
            first = next((line for line in done.stderr.splitlines() if "error" in line), done.stderr.strip()[:200])
            raise UserError(f"model.decode_attention: the ragged kernel did not compile with {cxx}: {first}",
                            key="model.decode_attention")
        os.replace(so, out)
    return out


@functools.cache
def register() -> None:
    """The kernel loaded and registered with XLA (once a process)."""
    if jax.default_backend() != "cpu":
        raise UserError(f"model.decode_attention: 'ragged' is a CPU kernel; this run's devices are "
                        f"{jax.default_backend()!r} (use 'dense')", key="model.decode_attention")
    lib = ctypes.CDLL(str(library()))
    jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(lib.StarRaggedDecode), platform="cpu")


def ragged_decode_attention(q_BHK: jax.Array, k_BGSK: jax.Array, v_BGSK: jax.Array, allowed_BS: jax.Array,
                            prefix=None, prefix_allowed_BP: jax.Array | None = None) -> jax.Array:
    """softmax(q k^T / sqrt(K)) v over the keys each row may read (``allowed_BS``), a shared
    ``prefix``'s (keys, values), (1, G, P, K) each, first (``prefix_allowed_BP``); (B, H, K).
    The rows' caches are read only up to each row's last allowed slot."""
    register()
    B, _, K = q_BHK.shape
    G = k_BGSK.shape[1]
    if prefix is None:
        pk_GPK = pv_GPK = jnp.zeros((G, 0, K), jnp.float32)
        prefix_allowed_BP = jnp.zeros((B, 0), bool)
    else:
        pk_GPK, pv_GPK = (x[0].astype(jnp.float32) for x in prefix)
    f32 = lambda x: x.astype(jnp.float32)
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(q_BHK.shape, jnp.float32))
    return call(f32(q_BHK), f32(k_BGSK), f32(v_BGSK), allowed_BS.astype(bool), pk_GPK, pv_GPK,
                jnp.asarray(prefix_allowed_BP, bool))
