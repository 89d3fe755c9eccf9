"""The Wan transformer's tensor names in the original release's layout (``Wan-AI/Wan2.1-T2V-14B``'s
``diffusion_pytorch_model*.safetensors``, ComfyUI's repackaged ``wan2.1_t2v_1.3B_bf16.safetensors``,
city96's GGUFs; ComfyUI's saved checkpoints add ``model.diffusion_model.``): the inverse of diffusers'
``convert_wan_transformer_to_diffusers`` for Wan 2.1 T2V/I2V/FLF2V/VACE and Wan 2.2 A14B/TI2V-5B."""

from __future__ import annotations

from wanjax.io.key_layouts import KeyLayout, substitutions

_B = r"((?:vace_)?blocks\.\d+)\."  # a block, or a VACE control block
_EMB = r"condition_embedder\."
_IMG = _EMB + r"image_embedder\."

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
        ]
    ),
    prefixes=("", "model.diffusion_model."),
)
