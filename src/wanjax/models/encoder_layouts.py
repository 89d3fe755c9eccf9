"""The text encoder's tensor names in the original Wan release's layout: ``T5Encoder`` of the Wan
repository's ``wan/modules/t5.py`` (``models_t5_umt5-xxl-enc-bf16.pth``; Kijai's
``umt5-xxl-enc-bf16.safetensors`` and ``umt5-xxl-enc-fp8_e4m3fn.safetensors`` hold its state dict
unprefixed), for transformers' ``UMT5EncoderModel`` names.

The image encoder has no such layout here: Wan's CLIP (``wan/modules/clip.py``) stores q/k/v as one
fused ``to_qkv`` tensor and its class and position embeddings with a leading batch axis, which a
rename cannot express.
"""

from __future__ import annotations

from wanjax.io.key_layouts import KeyLayout, substitutions

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
