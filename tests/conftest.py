"""Test-wide environment: 8 fake CPU devices for sharding tests, fp32 matmuls for parity."""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flag = "--xla_force_host_platform_device_count=8"
if _flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_QWEN3 = REPO.parent / "shared" / "qwen3"


@pytest.fixture(scope="session")
def qwen3_tokenizer_dir() -> pathlib.Path:
    """The real Qwen3 tokenizer files (../shared/qwen3), else skip: no hub is reachable in CI."""
    if (SHARED_QWEN3 / "tokenizer.json").exists():
        return SHARED_QWEN3
    pytest.skip("../shared/qwen3 not present and the hub is unreachable here")
