"""RL of Qwen3-VL-30B-A3B (a computer-use policy that sees screenshots) on two 8x H200 hosts, SGLang serving.

    python -m launch.train --config=configs/qwen3_vl_30b_a3b_gpu.py --workdir=/runs/q30bvl \
        --config.init_checkpoint=/models/Qwen3-VL-30B-A3B-Instruct --config.tasks.train_dir=/data/tasks/train \
        --config.tasks.eval_dir=/data/tasks/heldout --config.sync.sglang_url=http://127.0.0.1:30000
    python -m launch.aot --config=configs/qwen3_vl_30b_a3b_gpu.py --step=grpo --image_patches=16384 \
        --fake_devices=16     # lower + compile the step on fake devices, per-GPU memory vs 141 GB

The text model is Qwen3-30B-A3B's architecture (48 layers, 128 experts top-8) with Qwen3-VL's interleaved 3-D
RoPE (mrope_section 24/20/20, rope_theta 5e6) and DeepStack features added after its first 3 layers; the vision
tower is Qwen3-VL's (27 blocks of width 1152, 16 heads, patch 16, 2x2 merge into the text width 2048, DeepStack
taps after blocks 8/16/24, a 48x48 learned position table). Both towers are laid out by the same logical rules
(research/models/sharding.py): the tower is ~0.4B parameters next to 30B, so its weights follow the text
model's fsdp/tensor split and its activations (a step's distinct screenshots, replicated: research/trees/
batch.py) are computed on every device. Everything else is configs/qwen3_30b_a3b_gpu.py's recipe.
"""

import dataclasses

import ml_collections

from configs import qwen3_30b_a3b_gpu
from research.models.image_processor import ImageProcessorConfig
from research.models.vision import VisionConfig

# Qwen3-VL-30B-A3B's vision_config (HF config.json), bf16 compute like the text model
VISION = VisionConfig(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, patch_size=16,
                      temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=2048, num_position_embeddings=2304,
                      deepstack_indexes=(8, 16, 24), dtype="bfloat16")
# its preprocessor_config.json: 16-px patches, 2x2 merge, images between 64k and 16M pixels
PROCESSOR = ImageProcessorConfig(patch_size=16, temporal_patch_size=2, merge_size=2)


def get_config(arg: str = "") -> ml_collections.ConfigDict:
    del arg
    config = qwen3_30b_a3b_gpu.get_config()
    config.name = "qwen3_vl_30b_a3b_rl_gpu"
    config.model.update(mrope_section=(24, 20, 20), deepstack_layers=len(VISION.deepstack_indexes),
                        rope_theta=5e6)
    config.vision = ml_collections.ConfigDict(dataclasses.asdict(VISION))
    config.image_processor = ml_collections.ConfigDict(dataclasses.asdict(PROCESSOR))
    return config
