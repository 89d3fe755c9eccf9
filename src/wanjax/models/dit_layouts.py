"""The Wan transformer's tensor names in the original release's layout (``Wan-AI/Wan2.1-T2V-14B``'s
``diffusion_pytorch_model*.safetensors``, ComfyUI's repackaged ``wan2.1_t2v_1.3B_bf16.safetensors``,
city96's GGUFs; ComfyUI's saved checkpoints add ``model.diffusion_model.``): the inverse of diffusers'
``convert_wan_transformer_to_diffusers`` for Wan 2.1 T2V/I2V/FLF2V/VACE and Wan 2.2 A14B/TI2V-5B/Animate.

Wan 2.2 Animate's own tensors (``Wan2.2-Animate-14B``'s files, Kijai's ComfyUI repackaging) in the
authors' names, as diffusers' converter maps them:

=====================================================  ==============================================
diffusers                                              original
=====================================================  ==============================================
``motion_encoder.conv_in.weight`` / ``.act_fn.bias``   ``motion_encoder.enc.net_app.convs.0.0.weight`` /
                                                       ``convs.0.1.bias`` (stored ``(1, C, 1, 1)``)
``motion_encoder.res_blocks.{i}.conv1|conv2``          ``convs.{i+1}.conv1.0|conv2.1`` (weight),
                                                       ``.conv1.1|conv2.2.bias`` (``(1, C, 1, 1)``)
``motion_encoder.res_blocks.{i}.conv_skip.weight``     ``convs.{i+1}.skip.1.weight``
``motion_encoder.conv_out.weight``                     ``convs.{n+1}.weight`` (after the n res blocks)
``motion_encoder.motion_network.{i}``                  ``motion_encoder.enc.fc.{i}``
``motion_encoder.motion_synthesis_weight``             ``motion_encoder.dec.direction.weight``
``face_encoder.conv1_local|conv2|conv3``               ``face_encoder.conv1_local|conv2|conv3.conv``
``face_adapter.{i}.to_q`` / ``to_out``                 ``face_adapter.fuser_blocks.{i}.linear1_q`` / ``linear2``
``face_adapter.{i}.to_k``, ``to_v``                    the two halves of ``fuser_blocks.{i}.linear1_kv``
``face_adapter.{i}.norm_q|norm_k``                     ``fuser_blocks.{i}.q_norm|k_norm``
=====================================================  ==============================================

(``pose_patch_embedding``, ``face_encoder.out_proj`` and ``.padding_tokens`` keep their names.) The
fused and reshaped tensors are read through views (:mod:`wanjax.io.tensor_views`).
"""

from __future__ import annotations

import re
from typing import Any

from wanjax.io.key_layouts import KeyLayout, substitutions
from wanjax.io.tensor_views import ReshapedRef, RowsRef

_B = r"((?:vace_)?blocks\.\d+)\."  # a block, or a VACE control block
_EMB = r"condition_embedder\."
_IMG = _EMB + r"image_embedder\."
_APP = "motion_encoder.enc.net_app.convs"  # the motion encoder's conv stack, in the authors' names
_FUSER = r"face_adapter.fuser_blocks.\1"
_SQUEEZED = ":squeezed"  # an activation bias without its (1, C, 1, 1) axes of size 1
_CONV_OUT = _APP + ".out.weight"  # the last conv (convs.{n+1}: its index depends on the model's size)
_ACT_BIAS = re.compile(re.escape(_APP) + r"\.(0\.1|\d+\.conv1\.1|\d+\.conv2\.2)\.bias")
_KV = re.compile(r"face_adapter\.fuser_blocks\.\d+\.linear1_kv\.(weight|bias)")
_LAST_CONV = re.compile(re.escape(_APP) + r"\.\d+\.weight")


def _res_block(part: str) -> Any:
    """The original name of a motion encoder residual block's tensor (``convs`` index one past it)."""
    return lambda m: f"{_APP}.{int(m.group(1)) + 1}.{part}"


def _animate_views(refs: dict[str, Any]) -> dict[str, Any]:
    """The file's tensors plus each activation bias without its size-1 axes, ``linear1_kv``'s halves
    (``:k``, ``:v``) and the motion encoder's last conv under one name."""
    views: dict[str, Any] = {}
    for name, ref in refs.items():
        if _ACT_BIAS.fullmatch(name) and len(ref.shape) == 4:
            views[name + _SQUEEZED] = ReshapedRef(ref, (ref.shape[1],))
        elif _KV.fullmatch(name) and ref.shape[0] % 2 == 0:
            half = ref.shape[0] // 2
            views[f"{name}:k"], views[f"{name}:v"] = RowsRef(ref, 0, half), RowsRef(ref, half, 2 * half)
        elif _LAST_CONV.fullmatch(name):
            views[_CONV_OUT] = ref
    return {**refs, **views}


def _read_as_views(name: str) -> bool:
    """The stored tensors the views above stand for (no leaf names them)."""
    return any(p.fullmatch(name) for p in (_ACT_BIAS, _KV, _LAST_CONV))


WAN_TRANSFORMER = KeyLayout(
    "Wan original",
    substitutions(
        [
            (_EMB + r"time_embedder\.linear_1\.(.+)", r"time_embedding.0.\1"),
            (_EMB + r"time_embedder\.linear_2\.(.+)", r"time_embedding.2.\1"),
            (_EMB + r"text_embedder\.linear_1\.(.+)", r"text_embedding.0.\1"),
            (_EMB + r"text_embedder\.linear_2\.(.+)", r"text_embedding.2.\1"),
            (_EMB + r"time_proj\.(.+)", r"time_projection.1.\1"),
            (_IMG + r"norm1\.(.+)", r"img_emb.proj.0.\1"),
            (_IMG + r"ff\.net\.0\.proj\.(.+)", r"img_emb.proj.1.\1"),
            (_IMG + r"ff\.net\.2\.(.+)", r"img_emb.proj.3.\1"),
            (_IMG + r"norm2\.(.+)", r"img_emb.proj.4.\1"),
            (_IMG + r"pos_embed", "img_emb.emb_pos"),
            (r"scale_shift_table", "head.modulation"),
            (r"proj_out\.(.+)", r"head.head.\1"),
            (_B + r"scale_shift_table", r"\1.modulation"),
            (_B + r"attn1\.to_([qkv])\.(.+)", r"\1.self_attn.\2.\3"),
            (_B + r"attn1\.to_out\.0\.(.+)", r"\1.self_attn.o.\2"),
            (_B + r"attn1\.norm_([qk])\.(.+)", r"\1.self_attn.norm_\2.\3"),
            (_B + r"attn2\.to_([qkv])\.(.+)", r"\1.cross_attn.\2.\3"),
            (_B + r"attn2\.to_out\.0\.(.+)", r"\1.cross_attn.o.\2"),
            (_B + r"attn2\.norm_([qk])\.(.+)", r"\1.cross_attn.norm_\2.\3"),
            (_B + r"attn2\.add_([kv])_proj\.(.+)", r"\1.cross_attn.\2_img.\3"),
            (_B + r"attn2\.norm_added_k\.(.+)", r"\1.cross_attn.norm_k_img.\2"),
            (_B + r"norm2\.(.+)", r"\1.norm3.\2"),  # the cross-attention's norm is norm3 there
            (_B + r"ffn\.net\.0\.proj\.(.+)", r"\1.ffn.0.\2"),
            (_B + r"ffn\.net\.2\.(.+)", r"\1.ffn.2.\2"),
            (_B + r"proj_in\.(.+)", r"\1.before_proj.\2"),  # VACE: the first control block's input
            (_B + r"proj_out\.(.+)", r"\1.after_proj.\2"),  # VACE: each control block's output
            # Animate (the table above)
            (r"motion_encoder\.motion_synthesis_weight", "motion_encoder.dec.direction.weight"),
            (r"motion_encoder\.conv_in\.weight", _APP + ".0.0.weight"),
            (r"motion_encoder\.conv_in\.act_fn\.bias", _APP + ".0.1.bias" + _SQUEEZED),
            (r"motion_encoder\.res_blocks\.(\d+)\.conv1\.weight", _res_block("conv1.0.weight")),
            (
                r"motion_encoder\.res_blocks\.(\d+)\.conv1\.act_fn\.bias",
                _res_block("conv1.1.bias" + _SQUEEZED),
            ),
            (r"motion_encoder\.res_blocks\.(\d+)\.conv2\.weight", _res_block("conv2.1.weight")),
            (
                r"motion_encoder\.res_blocks\.(\d+)\.conv2\.act_fn\.bias",
                _res_block("conv2.2.bias" + _SQUEEZED),
            ),
            (r"motion_encoder\.res_blocks\.(\d+)\.conv_skip\.weight", _res_block("skip.1.weight")),
            (r"motion_encoder\.conv_out\.weight", _CONV_OUT),
            (r"motion_encoder\.motion_network\.(.+)", r"motion_encoder.enc.fc.\1"),
            (r"face_encoder\.(conv1_local|conv2|conv3)\.(.+)", r"face_encoder.\1.conv.\2"),
            (r"face_adapter\.(\d+)\.to_q\.(.+)", _FUSER + r".linear1_q.\2"),
            (r"face_adapter\.(\d+)\.to_([kv])\.(.+)", _FUSER + r".linear1_kv.\3:\2"),
            (r"face_adapter\.(\d+)\.to_out\.(.+)", _FUSER + r".linear2.\2"),
            (r"face_adapter\.(\d+)\.norm_([qk])\.(.+)", _FUSER + r".\2_norm.\3"),
        ]
    ),
    prefixes=("", "model.diffusion_model."),
    ignore=_read_as_views,
    views=_animate_views,
)
