"""`python -m research.serving.cpu_kernels build`: compiles the CPU decode kernels into the cache the engine
loads them from, and prints the library's path.

Why an explicit step: the install command (README, .ci/setup.d/20-python.sh) runs it, so a missing compiler or
header fails the install with what to install instead of surfacing as a warning in the first engine run.
Exit 0: built (or cached), or nothing to build (`HRL_CPU_KERNELS=off`; a CPU without AVX2/FMA under `auto`:
the engine serves on XLA's ops). Exit 1: the build failed, or the CPU cannot run them under `on`.
"""

import argparse
import sys

from research.serving import cpu_kernels


def build() -> int:
    try:
        m = cpu_kernels.mode()
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    if m == "off":
        print("HRL_CPU_KERNELS=off: not building the CPU decode kernels")
        return 0
    try:
        lib = cpu_kernels.build()
    except cpu_kernels.UnsupportedCPU as e:
        print(f"CPU decode kernels not built: {e}", file=sys.stderr)
        return 1 if m == "on" else 0
    except cpu_kernels.KernelBuildError as e:
        print(f"CPU decode kernels: build failed: {e}", file=sys.stderr)
        return 1
    print(lib)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m research.serving.cpu_kernels",
                                     description="Build the JAX engine's CPU decode kernels.")
    parser.add_argument("command", choices=["build"], help="build: compile into the kernel cache, print its path")
    parser.parse_args(argv)
    return build()


if __name__ == "__main__":
    sys.exit(main())
