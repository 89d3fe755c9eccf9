"""The encoders' tensor names in the original Wan release's layout, for transformers' names.

Text encoder: ``T5Encoder`` of the Wan repository's ``wan/modules/t5.py``
(``models_t5_umt5-xxl-enc-bf16.pth``; Kijai's ``umt5-xxl-enc-bf16.safetensors`` and
``umt5-xxl-enc-fp8_e4m3fn.safetensors`` hold its state dict unprefixed), for ``UMT5EncoderModel``;
and llama.cpp's T5 names, which city96's GGUF text encoders use.

Image encoder: the ``visual`` ``VisionTransformer`` of ``XLMRobertaCLIP`` in ``wan/modules/clip.py``
(``models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth``; Kijai's
``open-clip-xlm-roberta-large-vit-huge-14_visual_fp16.safetensors`` holds its ``visual.*`` tensors
and the model's ``log_scale``), for ``CLIPVisionModel``. It stores q/k/v as one ``to_qkv`` tensor
(their rows in that order) and the class and position embeddings with leading batch axes: its
``views`` present these as the tensors they hold (:mod:`wanjax.io.tensor_views`), under names of
their own (``...to_qkv.weight:q``, ``visual.pos_embedding:squeezed``).
"""

from __future__ import annotations

import re
from typing import Any

from wanjax.io.key_layouts import KeyLayout, substitutions
from wanjax.io.tensor_views import ReshapedRef, RowsRef

_B = r"encoder\.block\.(\d+)\."
_ATTN = _B + r"layer\.0\.SelfAttention\."
_FFN = _B + r"layer\.1\.DenseReluDense\."

WAN_T5_LAYOUT = KeyLayout(
    "Wan original",
    substitutions(
        [
            (r"shared\.weight|encoder\.embed_tokens\.weight", "token_embedding.weight"),  # tied: one table
            (_B + r"layer\.0\.layer_norm\.weight", r"blocks.\1.norm1.weight"),
            (_ATTN + r"([qkvo])\.weight", r"blocks.\1.attn.\2.weight"),
            (_ATTN + r"relative_attention_bias\.weight", r"blocks.\1.pos_embedding.embedding.weight"),
            (_B + r"layer\.1\.layer_norm\.weight", r"blocks.\1.norm2.weight"),
            (_FFN + r"wi_0\.weight", r"blocks.\1.ffn.gate.0.weight"),  # the GELU branch
            (_FFN + r"wi_1\.weight", r"blocks.\1.ffn.fc1.weight"),  # the linear branch
            (_FFN + r"wo\.weight", r"blocks.\1.ffn.fc2.weight"),
            (r"encoder\.final_layer_norm\.weight", "norm.weight"),
        ]
    ),
)

# llama.cpp's T5 names, as city96's ``umt5-xxl-encoder-Q8_0.gguf`` (and the other types) hold them
# (ComfyUI-GGUF's ``T5_SD_MAP`` maps them back to these): ``ffn_gate`` is the GELU branch, ``ffn_up``
# the linear one, each layer with its own position table (``attn_rel_b``).
LLAMA_CPP_T5_LAYOUT = KeyLayout(
    "llama.cpp T5 (GGUF)",
    substitutions(
        [
            (r"shared\.weight|encoder\.embed_tokens\.weight", "token_embd.weight"),
            (_B + r"layer\.0\.layer_norm\.weight", r"enc.blk.\1.attn_norm.weight"),
            (_ATTN + r"([qkvo])\.weight", r"enc.blk.\1.attn_\2.weight"),
            (_ATTN + r"relative_attention_bias\.weight", r"enc.blk.\1.attn_rel_b.weight"),
            (_B + r"layer\.1\.layer_norm\.weight", r"enc.blk.\1.ffn_norm.weight"),
            (_FFN + r"wi_0\.weight", r"enc.blk.\1.ffn_gate.weight"),
            (_FFN + r"wi_1\.weight", r"enc.blk.\1.ffn_up.weight"),
            (_FFN + r"wo\.weight", r"enc.blk.\1.ffn_down.weight"),
            (r"encoder\.final_layer_norm\.weight", "enc.output_norm.weight"),
        ]
    ),
)

# ----------------------------------------------------------------------------------------------
# CLIP vision encoder

_V = r"(?:vision_model\.)?"  # transformers < 5 saves the names with it, 5 without
_LAYER = _V + r"encoder\.layers\.(\d+)\."
_QKV = re.compile(r"visual\.transformer\.\d+\.attn\.to_qkv\.(?:weight|bias)")
_EMBEDDINGS = {"visual.cls_embedding": 2, "visual.pos_embedding": 1}  # leading batch axes
_SQUEEZED = ":squeezed"  # an embedding's name without its batch axes


def _wan_clip_views(refs: dict[str, Any]) -> dict[str, Any]:
    """The file's tensors plus ``<to_qkv>:q|k|v`` (thirds of its rows) and each embedding without its
    leading axes of size 1 (a tensor of another shape gets no view: the spec names it missing)."""
    views: dict[str, Any] = {}
    for name, ref in refs.items():
        if _QKV.fullmatch(name) and ref.shape[0] % 3 == 0:
            d = ref.shape[0] // 3
            views.update({f"{name}:{part}": RowsRef(ref, i * d, (i + 1) * d) for i, part in enumerate("qkv")})
        axes = _EMBEDDINGS.get(name)
        if axes is not None and tuple(ref.shape[:axes]) == (1,) * axes:
            views[name + _SQUEEZED] = ReshapedRef(ref, tuple(ref.shape[axes:]))
    return {**refs, **views}


_WAN_CLIP_UNUSED = re.compile(
    r"log_scale|textual\..*"  # the CLIP's logit scale and text tower
    r"|visual\.(head(\..*)?|post_norm\..*)"  # the pooled output's projection and norm
    r"|visual\.(cls_embedding|pos_embedding|transformer\.\d+\.attn\.to_qkv\.(weight|bias))"  # read as views
)


def _wan_clip_unused(name: str) -> bool:
    return _WAN_CLIP_UNUSED.fullmatch(name) is not None


WAN_CLIP_LAYOUT = KeyLayout(
    "Wan original",
    substitutions(
        [
            (_V + r"embeddings\.patch_embedding\.weight", "visual.patch_embedding.weight"),
            (_V + r"embeddings\.class_embedding", "visual.cls_embedding" + _SQUEEZED),
            (_V + r"embeddings\.position_embedding\.weight", "visual.pos_embedding" + _SQUEEZED),
            (_V + r"pre_layrnorm\.(weight|bias)", r"visual.pre_norm.\1"),
            (_LAYER + r"layer_norm([12])\.(weight|bias)", r"visual.transformer.\1.norm\2.\3"),
            (_LAYER + r"self_attn\.([qkv])_proj\.(weight|bias)", r"visual.transformer.\1.attn.to_qkv.\3:\2"),
            (_LAYER + r"self_attn\.out_proj\.(weight|bias)", r"visual.transformer.\1.attn.proj.\2"),
            (_LAYER + r"mlp\.fc1\.(weight|bias)", r"visual.transformer.\1.mlp.0.\2"),
            (_LAYER + r"mlp\.fc2\.(weight|bias)", r"visual.transformer.\1.mlp.2.\2"),
            (_V + r"post_layernorm\.(weight|bias)", r"visual.post_norm.\1"),  # not loaded
        ]
    ),
    ignore=_wan_clip_unused,
    views=_wan_clip_views,
)
