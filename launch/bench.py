"""Benchmarks: `python -m launch.bench --suite=NAME [--opt key=value ...]`.

Each suite is `research.benchmarks.NAME.run(**opts) -> dict`; it measures this project against a peer
or baseline in the same run (ratios, since machines are shared and noisy). The last line printed is
`BENCH {json}`.
"""

import importlib
import json

from absl import app, flags

_SUITE = flags.DEFINE_string("suite", None, "benchmark suite: a module of research/benchmarks/", required=True)
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
    try:
        suite = importlib.import_module(f"research.benchmarks.{_SUITE.value}")
    except ModuleNotFoundError as e:
        raise app.UsageError(f"unknown suite {_SUITE.value!r}: {e}") from e
    result = suite.run(**_parse_opts(_OPT.value))
    print("BENCH " + json.dumps({"suite": _SUITE.value, **result}, sort_keys=True), flush=True)


if __name__ == "__main__":
    app.run(main)
