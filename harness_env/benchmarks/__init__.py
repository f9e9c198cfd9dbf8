"""`launch.bench` suites that run harnesses or sandboxes (research/benchmarks has the rest)."""

from __future__ import annotations


def ready_backend(name: str):  # noqa: ANN201 - harness_env.sandbox.base.Backend
    """The sandbox backend `name`, or RuntimeError saying why it cannot run here (a bench must not fake one)."""
    from harness_env.sandbox import get_backend

    backend = get_backend(name)
    ok, why = backend.available()
    if not ok:
        raise RuntimeError(f"backend {name} unavailable: {why}")
    return backend


def with_reference(harnesses: str) -> list[str]:
    """The harness names of a comma list, the reference agent first (every per-harness ratio is against it)."""
    names = [n for n in str(harnesses).split(",") if n]
    return names if "reference" in names else ["reference", *names]
