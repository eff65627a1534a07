"""The memory plan's measurement: a train step and a sampler compiled for a (dp, mp)
mesh with abstract parameters (``jax.ShapeDtypeStruct``s carrying their
``NamedSharding``s, nothing allocated), and XLA's per-device memory analysis of each
(``command.py`` says what the figures mean). jax is imported here but its backends
start only after ``setup_devices`` has asked for the simulated devices.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any, cast

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from star_engine import UserError

from ..model import network as model
from ..train import packing
from ..train import preference
from ..runtime import sharding
from ..train import trainer as tr
from ..model.config import architecture as arch
from ..options import AdamW
from ..sampling import static

MAX_DEVICES = 4096  # simulated CPU devices a plan may ask for


def parse_mesh(text: str) -> tuple[int, int]:
    try:
        dp, mp = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise UserError(f"--mesh: expected DPxMP like 1x8, got {text!r}") from None
    if dp < 1 or mp < 1 or dp * mp > MAX_DEVICES:
        raise UserError(f"--mesh: dp and mp must be >= 1 and dp x mp at most {MAX_DEVICES}, got {text!r}")
    return dp, mp



def setup_devices(n: int, platform: str) -> None:
    """Ask for ``n`` simulated CPU devices before jax starts its backends."""
    if platform == "cpu":
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        # XLA:CPU's default scheduler trades memory for thread-level concurrency; the
        # memory-minimising one is closer to what a TPU/GPU compile aims for (about
        # 25% smaller temporaries for the GPT-J train step). Set the flag yourself to
        # choose otherwise.
        flags = os.environ.get("XLA_FLAGS", "")
        if "xla_cpu_enable_concurrency_optimized_scheduler" not in flags:
            os.environ["XLA_FLAGS"] = (flags + " --xla_cpu_enable_concurrency_optimized_scheduler=false").strip()
        try:
            jax.config.update("jax_platforms", "cpu")
            jax.config.update("jax_num_cpu_devices", max(n, cast(Any, jax.config).jax_num_cpu_devices or 1))
        except (AttributeError, RuntimeError):
            pass  # backends already started: checked below
    if jax.device_count() < n:
        raise UserError(f"plan: the mesh needs {n} devices, jax has {jax.device_count()}; run in a fresh process "
                        f"(or with XLA_FLAGS=--xla_force_host_platform_device_count={n})")


def _abstract(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def _stats(compiled) -> dict[str, int]:
    ma = compiled.memory_analysis()
    fields = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes",
              "generated_code_size_in_bytes")
    out = {f.removesuffix("_size_in_bytes"): int(getattr(ma, f, 0) or 0) for f in fields}
    out["peak"] = out["argument"] + out["output"] - out["alias"] + out["temp"]
    return out


def plan_one(*, config, dp: int, mp: int, zero: int, opt_state_dtype: str, batch: int, grad_accum: int,
             seq_len: int, gen_batch: int, prompt_len: int, new_tokens: int, what: tuple[str, ...],
             master_dtype: str = "float32", accum_dtype: str = "float32", remat: bool = False,
             adapter: Any = None, objective: str = "tokens", section: str = "") -> list[dict]:
    """Compile the requested programs for one mesh; a list of result dicts. ``adapter``
    (``lora.LoraSpec``): the train step of LoRA adapters over the frozen base (in the
    compute dtype), their state fp32 (``master_dtype`` does not apply). ``objective``:
    "tokens" (the token loss) or "dpo" (the verifier's step: ``batch`` pairs a micro-batch,
    their chosen and rejected rows and reference log-probabilities, ``preference.py``).
    ``section`` (e.g. "[verifier]") heads the train step's program name."""
    mesh = sharding.make_mesh({"dp": dp, "mp": mp}, devices=jax.devices()[:dp * mp])
    params_abs = model.param_shapes(config)
    params_sh = sharding.tree_shardings(params_abs, mesh)
    results = []
    base = {"mesh": f"{dp}x{mp}", "layers": config.n_layer, "dtype": config.dtype}
    if "train" in what:
        step_lr = tr.StepLr(AdamW().schedule_fn(1000))  # the step as a run compiles it: its lr an argument
        tx = tr.with_state_dtype(AdamW().build(1000, learning_rate=step_lr), opt_state_dtype)
        if adapter is None:
            master_abs = jax.eval_shape(lambda p: tr.master_params(p, master_dtype), params_abs)
        else:
            master_abs = jax.eval_shape(lambda: tr.fresh_adapters(config, adapter, 0))
        state_abs = jax.eval_shape(lambda p: tr.init_state(p, tx), master_abs)
        state_sh = tr.state_shardings(state_abs, mesh, zero, model.dtype_of(config))
        extra: dict[str, Any] = {}
        rows = -(-batch // dp) * dp
        if objective == "dpo":
            extra["objective"] = functools.partial(preference.dpo_objective, beta=0.1)
            rows *= 2  # each pair's chosen and rejected sequences
        elif objective != "tokens":
            raise ValueError(f"objective: 'tokens' or 'dpo', got {objective!r}")
        update = tr.make_update(config, tx, mesh, state_shardings=state_sh, accum_dtype=accum_dtype, remat=remat,
                                adapter=adapter, step_lr=step_lr, **extra)
        frozen = () if adapter is None else (_abstract(params_abs, params_sh),)
        bsh = sharding.batch_sharding(mesh, batch_axis=1, ndim=3)
        batch_abs = {k: jax.ShapeDtypeStruct((grad_accum, rows, seq_len), jnp.bool_ if k == "weights" else jnp.int32,
                                             sharding=bsh) for k in packing.KEYS}
        if objective == "dpo":
            batch_abs["ref"] = jax.ShapeDtypeStruct((grad_accum, rows, 1), jnp.float32, sharding=bsh)
        t0 = time.perf_counter()
        lr_abs = jax.ShapeDtypeStruct((), jnp.float32, sharding=sharding.replicated(mesh))
        lowered = cast(Any, update).lower(_abstract(state_abs, state_sh), batch_abs, lr_abs, *frozen)
        t1 = time.perf_counter()
        compiled = lowered.compile()
        t2 = time.perf_counter()
        program = ("" if adapter is None else f"LoRA r={adapter.rank} ") + ("DPO step" if objective == "dpo" else
                                                                            "train step")
        results.append({**base, "program": f"{section} {program}" if section else program,
                        "zero": zero, "opt_state_dtype": opt_state_dtype,
                        "master_dtype": master_dtype if adapter is None else "-", "accum_dtype": accum_dtype, "remat": remat,
                        "shape": f"{grad_accum} x {rows} x {seq_len}", "lower_s": round(t1 - t0, 1),
                        "compile_s": round(t2 - t1, 1), **_stats(compiled)})
        del compiled, lowered
    if "sample" in what:
        rows = -(-gen_batch // dp) * dp
        rsh = NamedSharding(mesh, P("dp", None))
        ksh = NamedSharding(mesh, P("dp"))
        tokens = jax.ShapeDtypeStruct((rows, prompt_len), jnp.int32, sharding=rsh)
        mask = jax.ShapeDtypeStruct((rows, prompt_len), jnp.bool_, sharding=rsh)
        keys = jax.ShapeDtypeStruct((rows,), jax.random.key(0).dtype, sharding=ksh)
        t0 = time.perf_counter()
        lowered = static.generate.lower(_abstract(params_abs, params_sh), tokens, mask, keys, 0.0, 1.0,
                                        config=config, max_new_tokens=new_tokens, eos_id=50256,
                                        valid_vocab=min(50257, config.vocab) if arch(config) == "gptj" else None)
        t1 = time.perf_counter()
        compiled = lowered.compile()
        t2 = time.perf_counter()
        results.append({**base, "program": "sample (prefill + decode loop)", "zero": 0, "opt_state_dtype": "-",
                        "master_dtype": "-", "accum_dtype": "-", "remat": "-",
                        "shape": f"{rows} x ({prompt_len} + {new_tokens})", "lower_s": round(t1 - t0, 1),
                        "compile_s": round(t2 - t1, 1), **_stats(compiled)})
    return results


def devices_line() -> str:
    """jax's version and the devices a plan compiles for (the table's heading)."""
    return f"jax {jax.__version__} on {jax.devices()[0].platform} ({jax.device_count()} devices)"
