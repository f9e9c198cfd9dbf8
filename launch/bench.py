"""Benchmarks: `python -m launch.bench --suite=NAME [--opt key=value ...]`.

Each suite is `research.benchmarks.NAME.run(**opts) -> dict` (or `harness_env.benchmarks.NAME` for the
suites that run harnesses or sandboxes); it measures this project against a peer or baseline in the same
run (ratios, since machines are shared and noisy). The last line printed is `BENCH {json}`.
"""

import importlib
import json

from absl import app, flags

_SUITE = flags.DEFINE_string("suite", None, "benchmark suite: a module of research/benchmarks/ or "
                             "harness_env/benchmarks/", required=True)
_OPT = flags.DEFINE_multi_string("opt", [], "suite option key=value (value parsed as JSON if it can be)")


def _parse_opts(opts: list[str]) -> dict:
    out = {}
    for kv in opts:
        key, sep, value = kv.partition("=")
        if not sep:
            raise app.UsageError(f"--opt {kv!r} is not key=value")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def main(argv):
    del argv
    suite = None
    for package in ("research.benchmarks", "harness_env.benchmarks"):
        try:
            suite = importlib.import_module(f"{package}.{_SUITE.value}")
            break
        except ModuleNotFoundError as e:
            if e.name != f"{package}.{_SUITE.value}":  # the suite exists but one of its imports is missing
                raise
    if suite is None or not callable(getattr(suite, "run", None)):
        raise app.UsageError(f"unknown suite {_SUITE.value!r} (no module of that name with a run() in "
                             "research/benchmarks or harness_env/benchmarks)")
    result = suite.run(**_parse_opts(_OPT.value))
    print("BENCH " + json.dumps({"suite": _SUITE.value, **result}, sort_keys=True), flush=True)


if __name__ == "__main__":
    app.run(main)
