"""Unmodified means unmodified: a harness CLI's installed files, byte for byte, against the npm registry's.

What is checked, per npm harness: the CLI's package and the optional dependencies it names that npm installed
(its platform binaries, e.g. `@openai/codex` and its `linux-x64` build aliased as `@openai/codex-linux-x64`).
For each: (1) the integrity npm recorded at install (node_modules/.package-lock.json)
equals the one the registry serves for that name@version now; (2) the registry's tarball (downloaded once into
a cache outside the repo, its sha512 checked against that integrity) holds exactly the installed files, with
the same bytes. What the package's OWN install script did (a `postinstall` in its package.json) is reported,
never hidden, and accepted only in two forms: a file replaced by a byte-identical file of the CLI's own
platform package (Claude Code's and opencode's `bin/*.exe` placeholders become the linux-x64 binary), or a
file the script removed (OpenClaw's `.openclaw-lifecycle-pending` marker). Any other difference fails. Files
beside the tarball's (nested dependencies, files the script added) are counted. The CLIs' third-party
dependencies (OpenClaw pulls ~330) are npm's to verify at install (lockfile integrity).

    python -m harness_env.harnesses.verify [claude_code codex ...]     # exit 1 on any difference
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import tarfile
import tempfile

from harness_env.harnesses.base import get_harness, harness_names
from harness_env.harnesses.install import NpmPackage, cache_root, install_dir

TARBALLS = pathlib.Path(os.environ.get("HARNESS_RL_NPM_TARBALLS", "/opt/harness-rl/npm-tarballs"))


def _npm(*args: str, cwd: pathlib.Path | None = None, timeout: float = 600) -> str:
    env = {**os.environ, "npm_config_update_notifier": "false", "npm_config_loglevel": "error"}
    r = subprocess.run(["npm", *args], capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"npm {' '.join(args)}: exit {r.returncode}: {r.stderr[-400:]}")
    return r.stdout


def registry_integrity(spec: str) -> str:
    """The sha512 integrity the registry serves for `spec` (name@version) now."""
    return json.loads(_npm("view", spec, "dist.integrity", "--json", timeout=120))


def _sri(path: pathlib.Path) -> str:
    h = hashlib.sha512()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return "sha512-" + base64.b64encode(h.digest()).decode()


def tarball(spec: str, integrity: str) -> pathlib.Path:
    """The registry's tarball of `spec`, cached by its integrity; a download whose sha512 differs is refused."""
    TARBALLS.mkdir(parents=True, exist_ok=True)
    out = TARBALLS / (hashlib.sha256(integrity.encode()).hexdigest()[:32] + ".tgz")
    if out.exists() and _sri(out) == integrity:
        return out
    with tempfile.TemporaryDirectory(dir=TARBALLS) as tmp:
        name = json.loads(_npm("pack", spec, "--json", "--pack-destination", tmp, cwd=pathlib.Path(tmp)))[0]
        got = pathlib.Path(tmp) / name["filename"]
        if _sri(got) != integrity:
            raise RuntimeError(f"{spec}: the downloaded tarball's sha512 is not the registry's integrity")
        os.replace(got, out)
    return out


def _tar_digests(tgz: pathlib.Path) -> dict[str, str]:
    out = {}
    with tarfile.open(tgz, "r:gz") as tf:
        for m in tf:
            if m.isfile():
                rel = m.name.split("/", 1)[1] if "/" in m.name else m.name
                out[rel] = hashlib.sha256(tf.extractfile(m).read()).hexdigest()
    return out


def _dir_digests(d: pathlib.Path) -> dict[str, str]:
    out = {}
    for dirpath, _, filenames in os.walk(d):
        for n in filenames:
            p = os.path.join(dirpath, n)
            if os.path.isfile(p) and not os.path.islink(p):
                with open(p, "rb") as f:
                    out[os.path.relpath(p, d)] = hashlib.file_digest(f, "sha256").hexdigest()
    return out


def cli_packages(pkg: NpmPackage, root: pathlib.Path | None = None) -> list[tuple[str, str, str]]:
    """(install path, name@version, recorded integrity) of the CLI's own packages in its install: the CLI and
    the optional dependencies its package.json names (its platform builds) that npm installed here."""
    prefix = install_dir(pkg, root)
    lock = json.loads((prefix / "node_modules" / ".package-lock.json").read_text())["packages"]
    main = f"node_modules/{pkg.name}"
    optional = json.loads((prefix / main / "package.json").read_text()).get("optionalDependencies") or {}
    out = []
    for path in [main, *(f"node_modules/{n}" for n in sorted(optional))]:
        entry = lock.get(path)
        if entry is not None:
            out.append((path, f"{entry.get('name') or path.split('node_modules/', 1)[1]}@{entry['version']}",
                        entry.get("integrity", "")))
    return out


def _install_script(d: pathlib.Path) -> bool:
    scripts = json.loads((d / "package.json").read_text()).get("scripts") or {}
    return any(k in scripts for k in ("preinstall", "install", "postinstall"))


def verify(pkg: NpmPackage, root: pathlib.Path | None = None) -> list[dict]:
    """One report per CLI package: {path, spec, integrity_ok, files, missing, changed, by_script, extra, ok}."""
    prefix = install_dir(pkg, root or cache_root())
    pkgs = cli_packages(pkg, root)
    digests = {path: _dir_digests(prefix / path) for path, _, _ in pkgs}
    reports = []
    for path, spec, recorded in pkgs:
        served = registry_integrity(spec)
        want, got = _tar_digests(tarball(spec, served)), digests[path]
        missing = sorted(set(want) - set(got))
        changed = sorted(k for k in set(want) & set(got) if want[k] != got[k])
        script = _install_script(prefix / path)
        siblings = {h: f"{p}/{f}" for p, d in digests.items() if p != path for f, h in d.items()}
        by_script = {}
        if script:
            by_script.update({f: "removed" for f in missing})
            by_script.update({f: f"= {siblings[got[f]]}" for f in changed if got[f] in siblings})
        unexplained = [f for f in (*missing, *changed) if f not in by_script]
        reports.append({"path": path, "spec": spec, "integrity_ok": bool(recorded) and recorded == served,
                        "files": len(want), "missing": missing, "changed": changed, "by_script": by_script,
                        "extra": len(set(got) - set(want)), "unexplained": unexplained,
                        "ok": bool(recorded) and recorded == served and not unexplained})
    return reports


def main(argv: list[str]) -> int:
    names = argv or [n for n in harness_names() if getattr(get_harness(n), "package", None) is not None]
    bad = 0
    for n in names:
        for r in verify(get_harness(n).package):
            bad += not r["ok"]
            print(f"{'ok  ' if r['ok'] else 'DIFF'} {n}: {r['spec']} ({r['files']} files) integrity "
                  f"{'= registry' if r['integrity_ok'] else 'DIFFERS'}; by its install script: {r['by_script']}; "
                  f"unexplained differences: {len(r['unexplained'])} {r['unexplained'][:3]}; files beside the "
                  f"tarball's: {r['extra']}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
