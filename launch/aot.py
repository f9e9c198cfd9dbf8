"""AOT-compile a config's real train steps on fake devices and report per-device memory (research/train/aot.py).

    python -m launch.aot --config=configs/qwen3_30b_a3b_gpu.py --step=grpo,ppo,sft --kl --replay --fake_devices=16
    python -m launch.aot --config=configs/tiny.py

Fake CPU devices must be configured before JAX creates its backend, so `--fake_devices` is applied first thing
in main, before the first JAX call creates the backend (importing JAX does not).
"""

import json
import os

import jax
from absl import app, flags
from ml_collections import config_flags

from research.train.aot import STEPS, aot_compile, format_report

_CONFIG = config_flags.DEFINE_config_file("config", None, "config file (e.g. configs/qwen3_30b_a3b_gpu.py)")
_STEP = flags.DEFINE_list("step", [], f"steps to compile, of {STEPS} (default: the config's algo, or sft)")
_KL = flags.DEFINE_bool("kl", False, "RL steps: KL penalty on (the batch carries reference log-probs)")
_REPLAY = flags.DEFINE_bool("replay", False, "RL/SFT steps of an MoE: routing replay on (recorded routed experts)")
_LAYERS = flags.DEFINE_integer("num_layers", None, "override depth (real width) for a quicker compile")
_FAKE = flags.DEFINE_integer("fake_devices", 0, "force this many XLA:CPU devices (0: use the real backend)")
_IMAGES = flags.DEFINE_integer("image_patches", 0, "a vision policy's step: patch rows of images in the batch (e.g. "
                                "4 screenshots of 1280x720 at patch 16 = 14400)")
_COMPILE = flags.DEFINE_bool("compile", True, "compile (memory report) or only lower")
_MOE_IMPL = flags.DEFINE_string("moe_impl", "shapes", "MoE kernel to compile ('shapes': the accelerators' "
                                "buffers; '': the config's)")


def main(argv):
    del argv
    if _FAKE.value:
        jax.config.update("jax_platforms", "cpu")
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={_FAKE.value}").strip()
    for step in _STEP.value or [None]:
        rep = aot_compile(_CONFIG.value, step=step, kl=_KL.value, replay=_REPLAY.value, num_layers=_LAYERS.value,
                          compile=_COMPILE.value, moe_impl=_MOE_IMPL.value or None, image_patches=_IMAGES.value)
        print(format_report(rep))
        print("AOT " + json.dumps(rep, sort_keys=True), flush=True)


if __name__ == "__main__":
    app.run(main)
