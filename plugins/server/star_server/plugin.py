"""The ``star_engine`` entry point of star-engine-server: the ``server`` generation engine."""

from __future__ import annotations

from star_engine import hookimpl

from .engine import ServerEngine


@hookimpl
def register_engines(register) -> None:
    register("server", ServerEngine)
