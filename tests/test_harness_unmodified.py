"""Unmodified means unmodified (harness_env/harnesses/verify.py): every npm harness CLI as installed is the npm
registry's, byte for byte (what the package's own install script did is named), and a changed byte fails."""

import os
import pathlib
import shutil
import subprocess
import tempfile

import pytest

from harness_env.harnesses import get_harness
from harness_env.harnesses.install import cache_root, install_dir, is_installed
from harness_env.harnesses.verify import verify

pytestmark = pytest.mark.harness
CLIS = ("claude_code", "codex", "opencode", "openclaw")


@pytest.mark.timeout(1200)  # a fresh machine downloads the registry's tarballs once (~430 MB in all)
@pytest.mark.parametrize("name", CLIS)
def test_the_installed_cli_is_the_registrys(name):
    pkg = get_harness(name).package
    assert is_installed(pkg), f"{name} is not installed (.ci/setup.d/40-harnesses.sh)"
    reports = verify(pkg)
    assert reports and reports[0]["spec"] == pkg.spec
    for r in reports:
        assert r["ok"] and r["integrity_ok"] and not r["unexplained"], r
        for f, how in r["by_script"].items():  # only a removal, or a copy of the CLI's own platform binary
            assert how == "removed" or how.startswith("= node_modules/"), (f, how)


def test_a_changed_byte_in_the_cli_fails(tmp_path):
    pkg = get_harness("codex").package
    root = tempfile.mkdtemp(dir=cache_root().parent, prefix="verify-test-")  # same filesystem: hard links
    try:
        subprocess.run(["cp", "-al", str(install_dir(pkg)), root], check=True)
        js = install_dir(pkg, pathlib.Path(root)) / "node_modules" / pkg.name / "bin" / "codex.js"
        text = js.read_bytes()
        os.unlink(js)  # break the hard link before writing
        js.write_bytes(text.replace(b"codex", b"codeX", 1))
        (r, *_) = verify(pkg, pathlib.Path(root))
        assert not r["ok"] and r["unexplained"] == ["bin/codex.js"] and r["integrity_ok"], r
    finally:
        shutil.rmtree(root, ignore_errors=True)
