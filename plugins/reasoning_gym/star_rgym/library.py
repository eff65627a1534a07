"""The one door to the ``reasoning-gym`` package: imported on first use (``star-engine plugins``
and runs of other tasks never pay its ~2 s import), with a one-line error naming the package
when it is missing, and its true version (``reasoning_gym.__version__`` says 0.1.19 inside
0.1.25: the distribution's metadata is read instead)."""

from __future__ import annotations

import contextlib
import difflib
import io
from functools import cache
from importlib import metadata
from types import ModuleType
from collections.abc import Iterator

from star_engine import UserError

DISTRIBUTION = "reasoning-gym"
REQUIREMENT = "reasoning-gym>=0.1.25"


@cache
def rg() -> ModuleType:
    """The ``reasoning_gym`` module; UserError naming the package when it cannot be imported."""
    try:
        import reasoning_gym
        import reasoning_gym.factory  # noqa: F401  (DATASETS)
        import reasoning_gym.utils  # noqa: F401  (extract_answer, SYSTEM_PROMPTS)
    except ModuleNotFoundError as e:
        if e.name is not None and e.name.split(".")[0] == "reasoning_gym":
            raise UserError(f"the reasoning_gym task needs the package {DISTRIBUTION}, which is not installed: "
                            f"pip install '{REQUIREMENT}'") from None
        raise UserError(f"{DISTRIBUTION} could not be imported: {e} (reinstall it: pip install "
                        f"'{REQUIREMENT}')") from None
    except ImportError as e:
        raise UserError(f"{DISTRIBUTION} could not be imported: {e}") from None
    return reasoning_gym


def version() -> str:
    """The installed ``reasoning-gym`` distribution's version (not ``reasoning_gym.__version__``)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def datasets() -> dict[str, tuple[type, type]]:
    """reasoning-gym's registry: name -> (dataset class, config class)."""
    return rg().factory.DATASETS


def dataset_classes(name: str, key: str = "name") -> tuple[type, type]:
    """(dataset class, config class) of ``name``; an unknown name is a UserError naming ``key``
    and the close names."""
    known = datasets()
    if not isinstance(name, str) or not name:
        raise UserError(f"{key}: must be the name of a reasoning-gym dataset (a string), got {name!r}", key=key)
    if name not in known:
        close = difflib.get_close_matches(name, sorted(known), n=5, cutoff=0.6)
        hint = f"close names: {', '.join(close)}" if close else "no close name"
        raise UserError(f"{key}: unknown reasoning-gym dataset {name!r}; {hint} ({len(known)} datasets in "
                        f"{DISTRIBUTION} {version()}: sorted(reasoning_gym.factory.DATASETS))", key=key)
    return known[name]


def extract_answer(text: str) -> str | None:
    """reasoning-gym's own extraction: the last ``<answer>...</answer>``, stripped."""
    return rg().utils.extract_answer(text, tag_name="answer")


def system_prompts() -> dict[str, str]:
    return dict(rg().utils.SYSTEM_PROMPTS)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Some datasets print while they generate or score (``bf`` prints dots): keep it off the
    terminal, where the run's progress bars are."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def short(exc: BaseException) -> str:
    """One line for an exception from reasoning-gym."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."
