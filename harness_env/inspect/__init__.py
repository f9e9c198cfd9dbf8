"""A read-only web viewer over a training run's workdir: `python -m launch.inspect --workdir=DIR`.

index.py keeps an incremental index of the run's jsonl logs (runs -> steps -> groups -> rollouts), tree_view.py
rebuilds a group's prefix tree as the trainer saw it, pages.py / charts.py render plain HTML, server.py serves it
(aiohttp, 127.0.0.1 by default). Nothing here writes into the workdir.
"""

from harness_env.inspect.index import WorkdirIndex
from harness_env.inspect.queries import Filter
from harness_env.inspect.server import make_app, serve, start

__all__ = ["Filter", "WorkdirIndex", "make_app", "serve", "start"]
