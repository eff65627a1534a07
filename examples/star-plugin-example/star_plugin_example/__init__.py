"""star-plugin-example: a third-party star-engine plugin adding a unit-conversion
task (``unit_conversion``), its answer checker (``unit_numeric``) and its hint
formatter (``unit_answer``)."""

from importlib.metadata import PackageNotFoundError, version

from .checker import UnitNumericChecker
from .task import AnswerHint, UnitConversionTask

try:
    __version__ = version("star-plugin-example")
except PackageNotFoundError:  # used from a source checkout
    __version__ = "0.0.0"

__all__ = ["AnswerHint", "UnitConversionTask", "UnitNumericChecker", "__version__"]
