"""What runs inside the checker's worker process: math-verify's ``parse`` and ``verify``, with
the parsed gold answers cached.

math-verify bounds its own calls with ``signal.alarm``, which works only in a main thread and
cannot stop a computation that stays inside C (sympy's exact powers, ``10^{10^{10}}``). So the
library's timeouts are off here (``parsing_timeout=None``, ``timeout_seconds=None``) and the
bound is the parent's: it waits ``timeout_seconds`` for each answer and kills this process when
it runs past (``star_mathverify.pool``). The process is a fresh interpreter (nothing of the
parent's JAX state is inherited) and serves one request at a time.

The first message it reads is the checker's options; then requests (tuples) and replies:

- ``("gold", gold)`` -> ``("ok", shown)``: ``gold`` parsed and cached; ``shown`` is what
  math-verify read (its matched text), None when it read no expression (nothing, or only a raw
  string it could not parse: ``\frac{1}{``, ``?``).
- ``("check", gold, answer)`` -> ``("ok", (predicted, correct))``: ``answer`` parsed and verified
  against the (cached) gold; ``predicted`` is math-verify's matched text of the answer, None
  when it found nothing (then wrong).
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
from typing import Any, Literal

GoldFormat = Literal["auto", "latex", "expr"]  # how gold answers are read (``Verifier.parse_gold``)
DELIMITERS = ("$", "\\(", "\\[", "\\boxed", "\\fbox")


class Verifier:
    """math-verify with the options of one checker; gold answers parsed once each (up to
    ``gold_cache`` of them, the least recently used dropped first)."""

    def __init__(self, options: Mapping[str, Any]):
        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

        self._parse, self._verify = parse, verify
        self._latex, self._expr = LatexExtractionConfig(), ExprExtractionConfig()
        self.gold_format = options["gold_format"]
        self.verify_options = {k: options[k] for k in ("float_rounding", "numeric_precision", "strict",
                                                       "allow_set_relation_comp")}
        self.cache_size = options["gold_cache"]
        self.cache: OrderedDict[str, list] = OrderedDict()
        self.gold_parses = 0  # gold answers parsed (cache misses)

    def parse_gold(self, gold: str) -> list:
        """``gold`` as math-verify reads a reference answer. ``"auto"``: text with math delimiters
        (``$``, ``\\(``, ``\\[``, ``\\boxed``) as it is, LaTeX and plain expressions alike; a bare
        answer (``\\frac{1}{2}``, ``[1,2)``, ``18``) as LaTeX math, else as a plain expression.
        ``"latex"``: LaTeX only (a bare answer in ``$...$``); ``"expr"``: plain expressions only."""
        hit = self.cache.get(gold)
        if hit is not None:
            self.cache.move_to_end(gold)
            return hit
        self.gold_parses += 1
        delimited = any(d in gold for d in DELIMITERS)
        if self.gold_format == "expr":
            parsed = self._read(gold, [self._expr])
        elif self.gold_format == "latex" or not delimited:
            parsed = self._read(gold if delimited else f"${gold}$", [self._latex])
            if not parsed and self.gold_format == "auto":
                parsed = self._read(gold, [self._expr])
        else:
            parsed = self._read(gold, [self._latex, self._expr])
        self.cache[gold] = parsed
        if len(self.cache) > self.cache_size:
            self.cache.popitem(last=False)
        return parsed

    def _read(self, text: str, config: list) -> list:
        return self._parse(text, extraction_config=config, parsing_timeout=None)

    def check(self, gold: str, answer: str) -> tuple[str | None, bool]:
        """(what math-verify read of ``answer``, whether it verifies against ``gold``)."""
        target = self._read(answer, [self._latex, self._expr])
        if not target:
            return None, False
        reference = self.parse_gold(gold)
        correct = bool(reference) and self._verify(reference, target, timeout_seconds=None, **self.verify_options)
        return shown(target), bool(correct)


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
                parsed = verifier.parse_gold(request[1])
                reply: Any = shown(parsed) if any(not isinstance(x, str) for x in parsed) else None
            elif request[0] == "stats":
                reply = {"gold_parses": verifier.gold_parses, "cached": len(verifier.cache)}
            else:
                reply = verifier.check(request[1], request[2])
        except MemoryError:  # past memory_mb (math-verify itself turns most into "no answer")
            reply = None if request[0] == "gold" else (None, False)
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

