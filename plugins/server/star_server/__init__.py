"""Sampling through an OpenAI-compatible inference server (issue #41): ``ServerProcess`` starts,
waits for and stops a server the engine runs; ``CompletionsClient`` asks it for completions.
Not wired into the engine yet (README.md says what the integration adds)."""

from __future__ import annotations

from .client import CompletionRequest, CompletionsClient, sample_seed
from .process import ServerProcess, check_command

__all__ = ["CompletionRequest", "CompletionsClient", "ServerProcess", "check_command", "sample_seed"]
