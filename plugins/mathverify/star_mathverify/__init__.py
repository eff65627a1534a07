"""math-verify for star-engine: the ``math_verify`` answer checker."""

from .checker import MathVerifyChecker

__all__ = ["MathVerifyChecker"]
