"""Browse a run's rollouts, prefix trees, held-out answers and metrics in a local, read-only web page.

    python -m launch.inspect --workdir=/tmp/demo                 # a launch.train run (live while it runs)
    python -m launch.inspect --workdir=/tmp/harness_rl_eval      # a launch.eval --out dir
    python -m launch.inspect --workdir=/tmp/sweep --port=8800    # a folder of runs (a launch.sweep dir)

Then open http://127.0.0.1:8765/ (an SSH tunnel for a remote run: ssh -L 8765:127.0.0.1:8765 host). The page
needs no network and writes nothing into the workdir (harness_env/inspect/).
"""

import os

from absl import app, flags

_WORKDIR = flags.DEFINE_string("workdir", None, "a run dir, a launch.eval --out dir, or a folder of runs",
                               required=True)
_HOST = flags.DEFINE_string("host", "127.0.0.1", "bind address (127.0.0.1: only this machine)")
_PORT = flags.DEFINE_integer("port", 8765, "port (0 = any free port)")


def main(argv):
    del argv
    # the trees' advantages go through research.advantages (jax): on CPU, never the accelerator a run trains on
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from harness_env.inspect.server import serve

    try:
        serve(_WORKDIR.value, host=_HOST.value, port=_PORT.value)
    except (FileNotFoundError, NotADirectoryError) as e:
        raise app.UsageError(str(e)) from e


if __name__ == "__main__":
    app.run(main)
