"""Agent harness adapters (Claude Code, Codex, opencode, OpenClaw, reference): see base.py."""

from harness_env.harnesses.base import (
    REGISTRY,
    Harness,
    HarnessError,
    HarnessOutcome,
    SessionContext,
    get_harness,
    harness_names,
    register,
)

__all__ = ["REGISTRY", "Harness", "HarnessError", "HarnessOutcome", "SessionContext", "get_harness",
           "harness_names", "register"]
