"""The release of star-engine (``star_engine.__version__``; recorded in every run directory)."""

__version__ = "0.1.0"
