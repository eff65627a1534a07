"""star-engine: a plugin-driven implementation of STaR (Self-Taught Reasoner)."""

import pluggy

__version__ = "0.1.0"

hookimpl = pluggy.HookimplMarker("star_engine")
"""Decorator for plugin hook implementations."""

__all__ = ["hookimpl", "__version__"]
