"""Sampling through an OpenAI-compatible inference server (``[generation] engine = "server"``):
``ServerEngine`` makes the server serve each iteration's weights and samples through it;
``ServerProcess`` starts, waits for and stops a server the engine runs; ``CompletionsClient``
asks it for completions."""

from __future__ import annotations

from .client import CompletionRequest, CompletionsClient, sample_seed
from .engine import ServerEngine, ServerOptions, cut_at_stop, folder_sha256
from .process import ServerProcess, check_command

__all__ = ["CompletionRequest", "CompletionsClient", "ServerEngine", "ServerOptions", "ServerProcess", "check_command",
           "cut_at_stop", "folder_sha256", "sample_seed"]
