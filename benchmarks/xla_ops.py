"""XLA's per-op profile of a jit'd call on the CPU: where a compiled program's time goes,
op by op, read from the profiler's own trace (``jax.profiler.trace``) and labelled from the
compiled program's text.

XLA:CPU runs each op of a program as a thunk and records one trace event per thunk, named
by its program and op. ``op_profile`` times ``calls`` calls under the profiler and gives
each op its wall time: the union, over every thread and device, of the time its events
cover and no nested op's event does, up to the ``end:`` event of an asynchronous thunk. A
loop's (or conditional's) own time is the time no other op runs on any thread: its body's
ops may run on Eigen's threads or another device's, not nested in its event. Ops that run at
the same time (two devices, or two independent thunks) each count theirs, so the rows add up
to the call's wall time or more. ``label`` reads each op's opcode, shape and source (the JAX
primitive and transformation path of its ``op_name`` metadata) from
``compiled.as_text()``; ``part`` sorts a row into a part of a training step by that path.

    rows = label(op_profile(lambda: jax.block_until_ready(step())), [compiled_text])
"""

from __future__ import annotations

import bisect
import collections
import glob
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+) = (\S+(?:\[[^\]]*\])?(?:\{[^}]*\})?) ([\w\-]+)\(")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


@dataclass(frozen=True)
class OpTime:
    name: str  # the op's name in its compiled program (a fusion, dot, all-reduce, ...)
    ms: float  # wall milliseconds per call
    count: float  # runs per call (an op in a loop body runs once an iteration), over every device
    module: str = ""  # the compiled program (jit_update, jit_decode, ...)
    opcode: str = ""
    shape: str = ""
    source: str = ""  # its op_name metadata: jit(...)/transformations/primitive


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``spans`` as sorted, disjoint intervals (overlapping ones joined)."""
    out: list[tuple[int, int]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _union(spans: list[tuple[int, int]]) -> int:
    return sum(e - s for s, e in _merged(spans))


def _minus(spans: list[tuple[int, int]], busy: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of ``spans`` outside the merged, sorted intervals ``busy``."""
    starts = [b[0] for b in busy]
    out = []
    for s, e in _merged(spans):
        i = max(bisect.bisect_right(starts, s) - 1, 0)
        while s < e and i < len(busy):
            bs, be = busy[i]
            if be <= s:
                i += 1
                continue
            if bs >= e:
                break
            if bs > s:
                out.append((s, bs))
            s = max(s, be)
            i += 1
        if s < e:
            out.append((s, e))
    return out


def _self_spans(events: list[tuple[int, int, tuple]],
                parents: set | None = None) -> dict[tuple, list[tuple[int, int]]]:
    """Per op, the parts of its events on one thread that no nested event covers (the ops
    that enclose another are added to ``parents``)."""
    spans: dict[tuple, list[tuple[int, int]]] = collections.defaultdict(list)
    stack: list[list] = []  # [end, key, cursor]: the open events, innermost last

    def close_to(t: int) -> None:
        while stack and stack[-1][0] <= t:
            end, key, cursor = stack.pop()
            if end > cursor:
                spans[key].append((cursor, end))
            if stack:
                stack[-1][2] = max(stack[-1][2], end)

    for s, e, key in sorted(events, key=lambda x: (x[0], -x[1])):
        close_to(s)
        if stack:  # the enclosing event's own time runs up to this child's start
            parent = stack[-1]
            if parents is not None:
                parents.add(parent[1])
            if s > parent[2]:
                spans[parent[1]].append((parent[2], s))
            parent[2] = e
        stack.append([e, key, s])
    close_to(1 << 62)
    return spans


def _stats(event) -> dict:
    return dict(event.stats) if hasattr(event, "stats") else {}


def op_profile(fn: Callable[[], object], calls: int = 3) -> list[OpTime]:
    """Each op's wall time per call over ``calls`` calls of ``fn`` (which must block until its
    result is ready), slowest first. An op is a thunk event (its ``hlo_module`` and ``hlo_op``);
    an asynchronous thunk (a dot that Eigen runs on its threads) lasts until its ``end:``
    event; the executor's and thread pools' own events are not ops."""
    import jax
    from jax.profiler import ProfileData

    folder = tempfile.mkdtemp(prefix="xla_ops_")
    with jax.profiler.trace(folder):
        for _ in range(calls):
            fn()
    path = glob.glob(f"{folder}/**/*.xplane.pb", recursive=True)[0]
    spans: dict[tuple, list[tuple[int, int]]] = collections.defaultdict(list)
    runs: collections.Counter[tuple] = collections.Counter()
    planes = [p for p in ProfileData.from_file(path).planes if p.name == "/host:CPU"]
    ends = {}  # flow id -> when an asynchronous thunk finished
    parents: set[tuple] = set()  # loops and conditionals: ops whose events enclose others
    for plane in planes:
        for line in plane.lines:
            for e in line.events:
                if e.name.startswith("end: "):
                    c = _stats(e).get("_c")
                    if c is not None:
                        ends[c] = e.start_ns + e.duration_ns
    for plane in planes:
        for line in plane.lines:
            events = []
            for e in line.events:
                st = _stats(e)
                if "hlo_op" not in st:
                    continue
                key = (str(st.get("hlo_module", "")), str(st["hlo_op"]))
                s, t = e.start_ns, e.start_ns + e.duration_ns
                events.append((s, t, key))
                runs[key] += 1
                done = ends.get(st.get("_p"))
                if done is not None and done > t:  # the rest of an asynchronous thunk
                    spans[key].append((t, done))
            for key, sp in _self_spans(events, parents).items():
                spans[key] += sp
    busy = _merged([sp for key, ss in spans.items() if key not in parents for sp in ss])
    for key in parents:  # a loop's own time: while no op runs anywhere
        spans[key] = _minus(spans[key], busy)
    rows = [OpTime(op, _union(sp) / 1e6 / calls, runs[(module, op)] / calls, module)
            for (module, op), sp in spans.items()]
    return sorted(rows, key=lambda r: -r.ms)


def label(rows: list[OpTime], compiled_texts: list[str]) -> list[OpTime]:
    """``rows`` with each op's opcode, shape and source, read from its program's compiled text
    (``jitted.lower(...).compile().as_text()``; the module's name is its first line's)."""
    info = {}
    for text in compiled_texts:
        head = text.split("\n", 1)[0].split()
        module = head[1].rstrip(",") if len(head) > 1 and head[0] == "HloModule" else ""
        for line in text.splitlines():
            m = _INSTR.match(line)
            if m:
                src = _OP_NAME.search(line)
                info[(module, m.group(1))] = (m.group(3), m.group(2).split("{")[0], src.group(1) if src else "")
    return [OpTime(r.name, r.ms, r.count, r.module, *info.get((r.module, r.name), ("", "", ""))) for r in rows]


def part(row: OpTime) -> str:
    """The part of a training step an op belongs to, by its source path: the output layer and
    its loss (the plain path's ``lm_head``, or the named scopes of ``chunked_ce``/``fused_ce``),
    the network's forward or backward, the collectives, a loop's own time between its body's
    ops, or the optimizer and the rest."""
    src = row.source
    if row.opcode in ("all-reduce", "all-gather", "reduce-scatter", "collective-permute") or \
            row.name.startswith(("all-reduce", "all-gather")):
        return "collectives"
    if row.opcode in ("while", "conditional", "call") or row.name.startswith(("while", "conditional")):
        return "loop gaps"  # a loop's own time: between its body's ops (dispatch, waiting for a core)
    if any(k in src for k in ("fused_ce", "chunked_ce", "lm_head")):
        return "head"
    if "transpose(" in src:
        return "backward"
    if "jvp(" in src or "checkpoint" in src:
        return "forward"
    return "optimizer/other"


def parts(rows: list[OpTime]) -> dict[str, float]:
    """Milliseconds per call of each ``part``, largest first."""
    out: dict[str, float] = collections.defaultdict(float)
    for r in rows:
        out[part(r)] += r.ms
    return {k: round(v, 1) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


def table(rows: list[OpTime], top: int = 20) -> str:
    """The top ``top`` rows and the total per part, as text."""
    total = sum(r.ms for r in rows) or 1.0
    out = [f"{'op':34s} {'ms/call':>8s} {'share':>6s} {'runs':>5s}  {'part':14s} shape / source"]
    for r in rows[:top]:
        out.append(f"{r.name[:34]:34s} {r.ms:8.1f} {100 * r.ms / total:5.1f}% {r.count:5g}  {part(r):14s} "
                   f"{r.opcode} {r.shape} {r.source[-70:]}")
    out.append("per part: " + ", ".join(f"{k} {v:.1f} ms ({100 * v / total:.0f}%)" for k, v in parts(rows).items()))
    return "\n".join(out)
