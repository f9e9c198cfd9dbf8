"""`python -m harness_env.harnesses [NAME ...]`: install the pinned npm harnesses (all by default).

The command lives here, above both install.py (how a package is installed) and base.py (which harnesses need
which packages): base.py imports install.py, so a `main` in install.py could reach the harness registry only
through an import inside the function.
"""

import argparse
import asyncio
import sys
import time

from harness_env.harnesses import install
from harness_env.harnesses.base import get_harness, harness_names
from harness_env.harnesses.install import InstallError, ensure_installed, ensure_py_installed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=install.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="harness names (default: all npm harnesses)")
    args = ap.parse_args(argv)
    names = args.names or [n for n in harness_names() if get_harness(n).npm_packages() or get_harness(n).py_packages()]
    failed = 0
    for name in names:
        harness = get_harness(name)
        for py in harness.py_packages():
            t0 = time.monotonic()
            try:
                path = asyncio.run(ensure_py_installed(py))
            except InstallError as e:
                print(f"[install] {name}: {py.spec} FAILED: {e}", file=sys.stderr)
                failed += 1
                continue
            print(f"[install] {name}: {py.spec} -> {path} ({time.monotonic() - t0:.1f} s)")
        for pkg in harness.npm_packages():
            t0 = time.monotonic()
            try:
                path = asyncio.run(ensure_installed(pkg, node=harness.node if pkg is not harness.node else None))
            except InstallError as e:
                print(f"[install] {name}: {pkg.spec} FAILED: {e}", file=sys.stderr)
                failed += 1
                continue
            print(f"[install] {name}: {pkg.spec} -> {path} ({time.monotonic() - t0:.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
