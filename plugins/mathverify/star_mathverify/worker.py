r"""What runs inside the checker's worker process: math-verify's ``parse`` and ``verify`` called
as the checker's ``convention`` says (``star_mathverify.conventions``), with the parsed gold
answers cached.

math-verify bounds its own calls with ``signal.alarm``, which works only in a main thread (this
process's requests run in its main thread) and cannot stop a computation that stays inside C
(sympy's exact powers, ``10^{10^{10}}``). So a library's convention keeps that library's own
timeouts (a timeout there is a wrong answer, as in the library), ``star_engine`` turns them off
(``parsing_timeout=None``, ``timeout_seconds=None``), and the bound that always holds is the
parent's: it waits ``timeout_seconds`` for each answer and kills this process when it runs past
(``star_mathverify.pool``). The process is a fresh interpreter (nothing of the parent's JAX state
is inherited) and serves one request at a time.

The first message it reads is the checker's options; then requests (tuples) and replies:

- ``("gold", gold)`` -> ``("ok", shown)``: ``gold`` parsed and cached; ``shown`` is what
  math-verify read (its matched text), None when the gold counts as unparsed (the convention's
  test: ``star_engine``, no expression read, only a raw string such as ``\frac{1}{`` or ``?``;
  a library, nothing read at all).
- ``("check", gold, answer)`` -> ``("ok", (predicted, correct, gold_read))``: ``answer`` parsed and
  verified against the (cached) gold; ``predicted`` is math-verify's matched text of the answer,
  None when it found nothing (then wrong); ``gold_read`` False when the gold counts as unparsed
  (then wrong).
- ``("stats",)`` -> ``("ok", {"gold_parses": n, "cached": m})``: gold answers parsed so far (the
  cache's misses) and held now.

The first message the process sends is ``("ready", None)``, or ``("missing", module)`` when
math-verify cannot be imported; an unexpected exception is answered ``("error", message)``.
"""

from __future__ import annotations

import ctypes
import logging
import signal
import sys
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from .conventions import GoldFormat, build

__all__ = ["GoldFormat", "Verifier", "main", "serve", "shown"]  # GoldFormat: still importable from here


class Verifier:
    """math-verify called as the checker's ``convention`` says (``conventions.build``), with the
    parsed gold answers cached (up to ``gold_cache`` of them, the least recently used dropped
    first)."""

    def __init__(self, options: Mapping[str, Any]):
        self.call = build(options)
        self.cache_size = options["gold_cache"]
        self.cache: OrderedDict[str, list] = OrderedDict()
        self.gold_parses = 0  # gold answers parsed (cache misses)

    def parse_gold(self, gold: str) -> list:
        """``gold`` parsed as the convention parses a reference answer (cached)."""
        hit = self.cache.get(gold)
        if hit is not None:
            self.cache.move_to_end(gold)
            return hit
        self.gold_parses += 1
        parsed = self.call.parse_gold(gold)
        self.cache[gold] = parsed
        if len(self.cache) > self.cache_size:
            self.cache.popitem(last=False)
        return parsed

    def read_gold(self, gold: str) -> str | None:
        """What the convention read of ``gold`` (``shown``), None when it counts as unparsed."""
        parsed = self.parse_gold(gold)
        return shown(parsed) if self.call.gold_read(parsed) else None

    def check(self, gold: str, answer: str) -> tuple[str | None, bool, bool]:
        """(what the convention read of ``answer``, whether it verifies against ``gold``, whether
        ``gold`` counts as parsed)."""
        reference = self.parse_gold(gold)
        target = self.call.parse_answer(answer)
        gold_read = self.call.gold_read(reference)
        correct = gold_read and bool(target) and self.call.verify(reference, target)
        return shown(target), bool(correct), gold_read


def shown(parsed: list) -> str | None:
    """The text math-verify matched (the last item of ``parse``'s list), else the first item."""
    if not parsed:
        return None
    return parsed[-1] if isinstance(parsed[-1], str) else str(parsed[0])


def _die_with_parent() -> None:
    """Linux: have the kernel kill this process when its parent dies (a computation stuck in C
    would otherwise run on after the parent was killed)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def serve(requests: Any, replies: Any) -> None:
    """The worker's loop: the options first, then answer requests until the pipe closes."""
    options = requests.recv()
    memory_mb = options.get("memory_mb", 0)
    if memory_mb:
        import resource

        cap = memory_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    for name in ("math_verify", "latex2sympy2_extended"):  # its notes on disabled timeouts: ours bound it
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        verifier = Verifier(options)
    except ImportError as e:
        replies.send(("missing", e.name or str(e)))
        return
    replies.send(("ready", None))
    while True:
        try:
            request = requests.recv()
        except (EOFError, OSError):
            return
        try:
            if request[0] == "gold":
                reply: Any = verifier.read_gold(request[1])
            elif request[0] == "stats":
                reply = {"gold_parses": verifier.gold_parses, "cached": len(verifier.cache)}
            else:
                reply = verifier.check(request[1], request[2])
        except MemoryError:  # past memory_mb (math-verify itself turns most into "no answer")
            reply = None if request[0] == "gold" else (None, False, True)
        except Exception as e:  # noqa: BLE001 -- reported to the parent, which names the plugin
            replies.send(("error", f"{type(e).__name__}: {e}"))
            continue
        replies.send(("ok", reply))


def main(argv: list[str]) -> None:
    """The worker process, reading requests on file descriptor ``argv[0]`` and replying on
    ``argv[1]`` (``star_mathverify.pool.WORKER`` starts it)."""
    from multiprocessing.connection import Connection

    _die_with_parent()
    serve(Connection(int(argv[0]), writable=False), Connection(int(argv[1]), readable=False))

