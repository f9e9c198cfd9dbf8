"""Sandboxes for rollouts: one async interface (base.py), backends bwrap (default), docker, kubernetes."""

from harness_env.sandbox.backends import get_backend
from harness_env.sandbox.base import (
    HOME,
    LABEL,
    WORKSPACE,
    Backend,
    ExecResult,
    Limits,
    Mount,
    Sandbox,
    SandboxError,
    SandboxSpec,
    SandboxStartError,
    register_backend,
)

__all__ = [
    "HOME", "LABEL", "WORKSPACE", "Backend", "ExecResult", "Limits", "Mount", "Sandbox", "SandboxError",
    "SandboxSpec", "SandboxStartError", "get_backend", "register_backend",
]
