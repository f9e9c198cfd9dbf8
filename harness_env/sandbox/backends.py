"""The sandbox backends by name: `get_backend("bwrap" | "docker" | "kubernetes", **kwargs)`.

Why a module of its own: every backend imports base.py (the interface it implements), so base.py could only
reach the backends through an import inside `get_backend`, a cycle that hid which modules the lookup needs.
This module sits above base.py and the backends and imports them at the top. That is cheap: the slow docker
and kubernetes SDKs are imported only where a backend first talks to its engine.
"""

from __future__ import annotations

from harness_env.sandbox import bwrap, docker_sandbox, kubernetes_sandbox
from harness_env.sandbox.base import BACKENDS, Backend

BUILT_IN = (bwrap.BwrapBackend, docker_sandbox.DockerBackend, kubernetes_sandbox.KubernetesBackend)


def get_backend(name: str, **kwargs) -> Backend:
    """A new backend of that name (a built-in or one added with `register_backend`)."""
    if name not in BACKENDS:
        raise KeyError(f"unknown sandbox backend {name!r}; known: {sorted(BACKENDS)}")
    return BACKENDS[name](**kwargs)
