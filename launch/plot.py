"""Plot held-out pass rate against minutes for several runs (e.g. a run and its control).

    python -m launch.plot --workdirs=workdirs/demo,workdirs/demo_control --labels="SFT then GRPO,SFT only" \
        --out=demo_vs_control.png
"""

from absl import app, flags

_WORKDIRS = flags.DEFINE_list("workdirs", None, "run directories of launch.train", required=True)
_LABELS = flags.DEFINE_list("labels", None, "one legend label per workdir (default: directory names)")
_OUT = flags.DEFINE_string("out", "runs.png", "output PNG")
_TITLE = flags.DEFINE_string("title", "held-out pass rate", "plot title")


def main(argv):
    del argv
    from research.rl.metrics import plot_runs

    if _LABELS.value and len(_LABELS.value) != len(_WORKDIRS.value):
        raise app.UsageError(f"--labels has {len(_LABELS.value)} entries for {len(_WORKDIRS.value)} workdirs")
    print(plot_runs(_WORKDIRS.value, _OUT.value, labels=_LABELS.value, title=_TITLE.value))


if __name__ == "__main__":
    app.run(main)
