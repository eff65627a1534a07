"""Reading a task's input files with errors that say ``file:line: reason``.

For task plugin authors: JSONL rows, typed fields and prompt files in the
original STaR format (examples separated by blank lines), and a task's four
few-shot prompts assembled from them.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any
from collections.abc import Callable, Mapping

from star_engine.errors import UserError

_TYPE_NAMES = {str: "a string", list: "a list", dict: "an object", int: "an integer"}


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    for typ, name in _TYPE_NAMES.items():
        if isinstance(value, typ):
            return name
    return "a number" if isinstance(value, float) else type(value).__name__


DATA_MAX = 4 << 30  # a data or prompts file larger than this is refused before it is read
STREAM_MAX = 256 << 20  # the most read from something that is not a regular file (a device, a pipe)


def read_capped(path: str | Path, cap: int) -> bytes:
    """The bytes of ``path``, refused (``UserError`` naming it) when there are more than ``cap``:
    a regular file by its size before reading, anything else (a device, a pipe) as it streams,
    beyond ``STREAM_MAX`` at most."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            st = os.fstat(f.fileno())
            if stat.S_ISREG(st.st_mode):
                if st.st_size > cap:
                    raise UserError(f"{p}: {st.st_size} bytes, more than the limit of {cap}")
                data = f.read(st.st_size + 1)  # read(n) allocates n: ask only for what is there
            else:  # nothing says how much will come: at most STREAM_MAX of it is kept
                cap = min(cap, STREAM_MAX)
                chunks, total = [], 0
                while total <= cap and (chunk := f.read(min(1 << 20, cap + 1 - total))):
                    chunks.append(chunk)
                    total += len(chunk)
                data = b"".join(chunks)
    except OSError as e:
        raise UserError(f"{p}: cannot read ({e.strerror or e})") from None
    if len(data) > cap:
        raise UserError(f"{p}: more than the limit of {cap} bytes")
    return data


def _read_text(path: Path) -> bytes:
    return read_capped(path, DATA_MAX)


def read_jsonl(path: str | Path, max_bytes: int | None = None,
               max_lines: int | None = None) -> list[tuple[str, dict[str, Any]]]:
    """The non-blank rows of a JSONL file as ``("file:line", object)`` pairs. ``max_bytes``
    (default ``DATA_MAX``) and ``max_lines`` (default none) are checked before any row is
    parsed: a ``UserError`` naming the file."""
    p = Path(path)
    data = read_capped(p, DATA_MAX if max_bytes is None else max_bytes)
    if max_lines is not None:
        lines = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
        if lines > max_lines:
            raise UserError(f"{p}: {lines} lines, more than the limit of {max_lines}")
    rows: list[tuple[str, dict[str, Any]]] = []
    for n, raw in enumerate(data.split(b"\n"), start=1):
        where = f"{p}:{n}"
        if n == 1 and raw.startswith(b"\xef\xbb\xbf"):  # a BOM some editors write
            raw = raw[3:]
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UserError(f"{where}: not valid UTF-8 (byte {e.start + 1} of the line)") from None
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{where}:{e.colno}: invalid JSON: {e.msg}") from None
        except RecursionError:
            raise UserError(f"{where}: invalid JSON: nested too deeply") from None
        except ValueError as e:  # an integer of more than 4300 digits
            raise UserError(f"{where}: invalid JSON: {e}") from None
        if not isinstance(obj, dict):
            raise UserError(f"{where}: expected a JSON object, got {_type_name(obj)}")
        if b"\\u" in raw and _lone_surrogate(obj):  # "\ud800" alone: JSON allows it, text has none
            raise UserError(f"{where}: invalid JSON: a string escapes a lone UTF-16 surrogate (\\ud800-\\udfff "
                            f"not in a pair), which is no character")
        rows.append((where, obj))
    if not rows:
        raise UserError(f"{p}: no examples (the file is empty)")
    return rows


def not_utf8(text: str) -> str | None:
    """``text`` shown with escapes (``a\\udcffb``) when it holds a code point no UTF-8 text can
    (a lone surrogate: bytes of a command line or file name that are not UTF-8, or a JSON
    escape of half a pair); None when it is text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode()
    return None


def _lone_surrogate(obj: Any) -> bool:
    """Whether a string of ``obj`` (keys included) holds a code point no UTF-8 text can."""
    return not_utf8(json.dumps(obj, ensure_ascii=False)) is not None


def get(obj: dict[str, Any], key: str, typ: type, where: str, name: str | None = None,
        required: bool = True, nonempty: bool = True) -> Any:
    """``obj[key]`` checked to be of ``typ``; ``name`` is the dotted name in messages."""
    name = name or key
    if key not in obj:
        if required:
            raise UserError(f"{where}: missing field '{name}'")
        return None
    value = obj[key]
    if not isinstance(value, typ) or isinstance(value, bool):
        raise UserError(f"{where}: field '{name}' must be {_TYPE_NAMES[typ]}, got {_type_name(value)}")
    if nonempty and not (value.strip() if isinstance(value, str) else value):
        raise UserError(f"{where}: field '{name}' is empty")
    return value


def read_blocks(path: str | Path, verbatim: bool = False) -> list[tuple[str, str]]:
    """A prompts file in the original STaR format: examples separated by blank
    lines, returned as ``("file:line", text)`` with the line the example starts on.

    By default the file is tidied: Windows line ends become ``\\n``, lines lose
    trailing blanks, runs of blank lines separate examples. ``verbatim`` reads it as
    the released STaR code does (``read().split("\\n\\n")``): the pieces between
    each ``"\\n\\n"``, nothing stripped, so ``"\\n\\n".join(pieces)`` is the file's text."""
    p = Path(path)
    try:
        text = _read_text(p).decode("utf-8" if verbatim else "utf-8-sig")
    except UnicodeDecodeError:
        raise UserError(f"{p}: not valid UTF-8") from None
    blocks: list[tuple[str, str]] = []
    if verbatim:
        if not text.strip():
            raise UserError(f"{p}: no examples (the file is empty)")
        at = 1
        for piece in text.split("\n\n"):
            blocks.append((f"{p}:{at}", piece))
            at += piece.count("\n") + 2
        return blocks
    start = 0
    lines: list[str] = []
    for n, line in enumerate(text.replace("\r\n", "\n").split("\n"), start=1):
        if line.strip():
            if not lines:
                start = n
            lines.append(line.rstrip())
        elif lines:
            blocks.append((f"{p}:{start}", "\n".join(lines)))
            lines = []
    if lines:
        blocks.append((f"{p}:{start}", "\n".join(lines)))
    if not blocks:
        raise UserError(f"{p}: no examples (the file is empty)")
    return blocks


def check_option_path(name: str, value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise UserError(f"{name}: expected a path string, got {_type_name(value)}")
    return value


PROMPT_KINDS = ("rationale", "direct", "hint", "direct_hint")
Examples = list[tuple[str, str, Any]]
"""Prompt examples as ("file:line", text, answer)."""


def prompt_files(prompts_file: Any, hint_prompts_file: Any, direct_prompts_file: Any,
                 direct_hint_prompts_file: Any) -> dict[str, str | None]:
    """A task's prompt-file options (each a path or None), checked, by prompt kind."""
    given = {"rationale": ("prompts_file", prompts_file), "hint": ("hint_prompts_file", hint_prompts_file),
             "direct": ("direct_prompts_file", direct_prompts_file),
             "direct_hint": ("direct_hint_prompts_file", direct_hint_prompts_file)}
    return {kind: check_option_path(name, value) for kind, (name, value) in given.items()}


def few_shot_prompts(files: Mapping[str, str | None], read: Callable[[str, str], Examples],
                     builtin: Callable[[str], Examples], hinted: Callable[[str, str, Any], str]) -> dict[str, str]:
    """A task's few-shot prompts for the four ``PROMPT_KINDS``, each joined as the original
    STaR code joins a prompt file's examples: ``"\\n\\n".join(examples) + "\\n\\n"``.

    ``read(path, kind)`` gives the examples of a kind's file, ``builtin(kind)`` those of
    "rationale" or "direct" when no file is given; a hinted kind ("hint", "direct_hint")
    without a file is derived from its plain kind's examples by ``hinted(where, text, answer)``."""
    plain = {kind: read(path, kind) if (path := files.get(kind)) else builtin(kind) for kind in ("rationale", "direct")}
    texts = {kind: [text for _, text, _ in examples] for kind, examples in plain.items()}
    for kind, base in (("hint", "rationale"), ("direct_hint", "direct")):
        path = files.get(kind)
        texts[kind] = ([text for _, text, _ in read(path, kind)] if path
                       else [hinted(where, text, answer) for where, text, answer in plain[base]])
    return {kind: "\n\n".join(texts[kind]) + "\n\n" for kind in PROMPT_KINDS}
