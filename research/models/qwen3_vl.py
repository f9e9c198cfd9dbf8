"""Qwen3-VL (dense and MoE text models): the vision tower (research/models/vision.py) feeding the Qwen3 text model
(research/models/qwen3.py) with 3-D RoPE and DeepStack.

    Qwen3VL(text_cfg, vision_cfg, image_token_id).apply({"params": p}, tokens_BxT, positions_3xBxT, segment_ids_BxT,
                                                        subtree_end_BxT, pixels_NxP=..., grid=...)
      -> hidden_BxTxD   (logits: qwen3.logits(p["language_model"], text_cfg, hidden))

The image placeholder tokens (`image_token_id`, t*h*w/merge**2 per image, in the order of `grid`) take the tower's
merged tokens as their embeddings; after each of the text model's first len(deepstack_indexes) layers the matching
DeepStack feature is added at those tokens. `positions_3xBxT` come from mrope.rope_index. Params: {"visual": tower,
"language_model": the Qwen3 text model's own layout}, so everything that reads a text policy's params (the LM head,
the trainer's logprobs) reads `params["language_model"]` unchanged. `hf_leaves` maps both to a
Qwen3VLForConditionalGeneration / Qwen3VLMoeForConditionalGeneration checkpoint's keys.
"""

from __future__ import annotations

import json
import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jaxtyping import Array, Float, Int

from research.models import hf_io
from research.models.config import ModelConfig
from research.models.mrope import IMAGE, TEXT, VisionGrid, rope_index, vision_grid
from research.models.qwen3 import Qwen3
from research.models.sharding import logical_shardings, use_mesh
from research.models.vision import VisionConfig, VisionTower
from research.models.vision import hf_leaves as vision_leaves

_TEXT_TYPES = {"qwen3_vl_text": "qwen3", "qwen3_vl_moe_text": "qwen3_moe"}


def configs_from_hf(path_or_dict: str | pathlib.Path | dict, **text_overrides) -> tuple[ModelConfig, VisionConfig,
                                                                                        int]:
    """(text config, vision config, image_token_id) from a Qwen3-VL config.json (file, model dir or dict)."""
    d = path_or_dict
    if not isinstance(d, dict):
        p = pathlib.Path(d)
        d = json.loads((p / "config.json" if p.is_dir() else p).read_text())
    text = dict(d["text_config"])
    if text.get("model_type") not in _TEXT_TYPES:
        raise hf_io.CheckpointError(f"text_config.model_type {text.get('model_type')!r} not in {sorted(_TEXT_TYPES)}")
    rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    section = tuple(rope.pop("mrope_section", (24, 20, 20)))
    rope.pop("mrope_interleaved", None)
    if text["model_type"] == "qwen3_vl_moe_text":  # its router always renormalises the top-k weights
        text.setdefault("norm_topk_prob", True)
    text.update(model_type=_TEXT_TYPES[text["model_type"]], rope_parameters={**rope, "rope_type": "default"},
                tie_word_embeddings=d.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
    vision = VisionConfig.from_hf(d["vision_config"])
    tcfg = ModelConfig.from_hf_config(text, mrope_section=section, deepstack_layers=len(vision.deepstack_indexes),
                                      **text_overrides)
    return tcfg, vision, int(d.get("image_token_id", 151655))


class Qwen3VL(nn.Module):
    text: ModelConfig
    vision: VisionConfig
    image_token_id: int

    @nn.compact
    def __call__(self, tokens_BxT: Int[Array, "B T"], positions_3xBxT: Int[Array, "3 B T"],
                 segment_ids_BxT: Int[Array, "B T"], subtree_end_BxT: Int[Array, "B T"], *,
                 pixels_NxP: Float[Array, "N P"] | None = None, grid: VisionGrid | None = None,
                 visual_index_M: Int[Array, " M"] | None = None, **text_kwargs):
        """`visual_index_M`: which merged token each placeholder token takes, in row-major order (default: the
        i-th placeholder takes the i-th merged token). A tree passes each distinct image once and indexes it from
        every placeholder node (research/trees/builder.py)."""
        if not self.text.mrope_section:
            raise ValueError("Qwen3VL: the text config has no mrope_section (build it with configs_from_hf)")
        if self.vision.out_hidden_size != self.text.hidden_size:
            raise ValueError(f"Qwen3VL: the vision tower's out_hidden_size {self.vision.out_hidden_size} != the text "
                             f"model's hidden_size {self.text.hidden_size}")
        lm = Qwen3(self.text, name="language_model")
        if pixels_NxP is None:
            return lm(tokens_BxT, positions_3xBxT, segment_ids_BxT, subtree_end_BxT, **text_kwargs)
        merged, deep = VisionTower(self.vision, name="visual")(pixels_NxP, grid)
        if visual_index_M is not None:
            merged, deep = merged[visual_index_M], tuple(d[visual_index_M] for d in deep)
        return lm(tokens_BxT, positions_3xBxT, segment_ids_BxT, subtree_end_BxT, visual_MxD=merged,
                  visual_mask_BxT=tokens_BxT == self.image_token_id,
                  deepstack_KxMxD=jnp.stack(deep) if deep else None, **text_kwargs)


def hf_leaves(text: ModelConfig, vision: VisionConfig) -> list[hf_io.Leaf]:
    """Both towers' params with their Qwen3VLForConditionalGeneration keys (the text model under
    model.language_model., the LM head at lm_head.; a MoE text model's experts fused, mlp.experts.gate_up_proj and
    down_proj, as Qwen3VLMoe stores them)."""
    out = []
    for leaf in hf_io.leaves(text, fused_experts=text.is_moe):
        key = (lambda k: lambda *i: k(*i).replace("model.", "model.language_model.", 1))(leaf.key)
        out.append(hf_io.Leaf(("language_model",) + leaf.path, leaf.shape, leaf.stack, key, leaf.hf_shape,
                              leaf.to_ours, leaf.to_hf))
    for leaf in vision_leaves(vision, "model.visual."):
        out.append(hf_io.Leaf(("visual",) + leaf.path, leaf.shape, leaf.stack, leaf.key, leaf.hf_shape, leaf.to_ours,
                              leaf.to_hf))
    return out


def params_from_state(text: ModelConfig, vision: VisionConfig, get) -> dict:  # noqa: ANN001
    """Qwen3VL params from an HF state in memory (`get(key) -> numpy array`)."""
    return hf_io.params_from_state(hf_leaves(text, vision), get, text.param_dtype)


def dummy_inputs(vision: VisionConfig, image_token_id: int) -> tuple[tuple, dict]:
    """(positional, keyword) inputs of one short sequence holding one image (2x2 merged tokens): for init and
    eval_shape, whose param shapes do not depend on them."""
    m = vision.spatial_merge_size
    grid = [(1, 2 * m, 2 * m)]
    types = np.array([TEXT] + [IMAGE] * 4 + [TEXT])
    tokens = np.where(types == IMAGE, image_token_id, 0)[None].astype(np.int32)
    pos, _ = rope_index(types, grid, merge=m)
    seg = np.ones_like(tokens)
    end = np.full_like(tokens, tokens.shape[1] - 1)
    kw = {"pixels_NxP": np.zeros((4 * m * m, vision.patch_dim), np.float32),
          "grid": vision_grid(grid, merge=m, side=vision.side)}
    return (tokens, pos[:, None], seg, end), kw


def init_sharded(model: Qwen3VL, mesh: Mesh, rng: jax.Array) -> dict:
    """Both towers' params initialised straight into their shards (the text config's logical rules for both)."""
    args, kw = dummy_inputs(model.vision, model.image_token_id)
    boxed = jax.eval_shape(lambda r: model.init(r, *args, **kw), rng)["params"]
    shardings = logical_shardings(boxed, mesh, model.text.logical_rules)
    with use_mesh(mesh):
        return jax.jit(lambda r: nn.meta.unbox(model.init(r, *args, **kw)["params"]), out_shardings=shardings)(rng)


def to_hf_config(text: ModelConfig, vision: VisionConfig, image_token_id: int) -> dict:
    """The config.json of a Qwen3VLForConditionalGeneration (dense text model) with these dims."""
    if text.is_moe:
        raise hf_io.CheckpointError("export of a Qwen3-VL-MoE checkpoint is not built (its fused experts load only)")
    t = text.to_hf_config()
    for k in ("architectures", "rope_theta", "tie_word_embeddings", "torch_dtype"):
        t.pop(k, None)
    t.update(model_type="qwen3_vl_text", rope_parameters={"rope_type": "default", "rope_theta": text.rope_theta,
                                                          "mrope_section": list(text.mrope_section),
                                                          "mrope_interleaved": True})
    v = {"model_type": "qwen3_vl", "depth": vision.depth, "hidden_size": vision.hidden_size,
         "intermediate_size": vision.intermediate_size, "num_heads": vision.num_heads,
         "in_channels": vision.in_channels, "patch_size": vision.patch_size,
         "temporal_patch_size": vision.temporal_patch_size, "spatial_merge_size": vision.spatial_merge_size,
         "out_hidden_size": vision.out_hidden_size, "num_position_embeddings": vision.num_position_embeddings,
         "deepstack_visual_indexes": list(vision.deepstack_indexes), "hidden_act": "gelu_pytorch_tanh",
         "rope_parameters": {"rope_type": "axial", "rope_theta": vision.rope_theta}}
    return {"model_type": "qwen3_vl", "architectures": ["Qwen3VLForConditionalGeneration"], "text_config": t,
            "vision_config": v, "image_token_id": image_token_id, "tie_word_embeddings": text.tie_word_embeddings}


def save_hf(params: dict, text: ModelConfig, vision: VisionConfig, image_token_id: int, path: str | pathlib.Path,
            **kw) -> pathlib.Path:
    """A checkpoint dir that transformers' Qwen3VLForConditionalGeneration.from_pretrained loads."""
    cfg = to_hf_config(text, vision, image_token_id)
    return hf_io.write_checkpoint(path, cfg, hf_io.leaf_state(params, hf_leaves(text, vision)), **kw)


def load_hf(path: str | pathlib.Path, **text_overrides) -> tuple[dict, ModelConfig, VisionConfig, int]:
    """(params, text config, vision config, image_token_id) of a Qwen3-VL checkpoint dir."""
    text, vision, image_id = configs_from_hf(path, **text_overrides)
    return params_from_state(text, vision, hf_io.state_reader(path)), text, vision, image_id
