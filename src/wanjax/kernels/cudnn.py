"""The ``cudnn`` backend: ``jax.nn.dot_product_attention(implementation="cudnn")`` on NVIDIA GPUs.

What it can run (:func:`cudnn_limit`), as JAX checks before calling cuDNN's fused flash attention
(``jax/_src/cudnn/fused_attention_stablehlo.py``: ``check_layout``, ``check_is_flash_attention``;
``jax/_src/nn/functions.py``: ``dot_product_attention``) and as cuDNN's support matrix says:

* an NVIDIA GPU of compute capability 8.0 (Ampere) or newer (cuDNN's SDPA support matrix);
* bfloat16 or float16 inputs (``check_layout``: "Q must be fp16/bf16/fp8...");
* a head dim that is a multiple of 8 and at most 256 on compute capability 9.0 (Hopper) and newer,
  at most 128 before (``check_is_flash_attention``);
* no local window: ``dot_product_attention`` gives cuDNN a left window only (with a causal mask), and
  refuses wanjax's two-sided ``|i - j| <= w`` one ("cuDNN doesn't support right window").
"""

from __future__ import annotations

import jax

from wanjax.kernels.common import AttentionShape, Platform

MIN_CAPABILITY = (8, 0)  # Ampere
HOPPER = (9, 0)


def max_head_dim(platform: Platform) -> int:
    """cuDNN flash attention's largest head dim on ``platform``'s GPU."""
    return 256 if platform.cuda is not None and platform.cuda >= HOPPER else 128


def cudnn_limit(platform: Platform, shape: AttentionShape | None = None) -> str | None:
    """Why cuDNN flash attention cannot run ``shape`` on ``platform`` (a phrase for an error message),
    or ``None`` when it can; without ``shape``, only whether it runs on ``platform`` at all."""
    if platform.cuda is None:
        return f"needs an NVIDIA GPU, unavailable on {platform.name}"
    if platform.cuda < MIN_CAPABILITY:
        return "needs an NVIDIA GPU of compute capability 8.0 or newer, this one has {}.{}".format(
            *platform.cuda
        )
    if shape is None:
        return None
    if shape.dtype not in ("bfloat16", "float16"):
        return f"needs bfloat16 or float16 activations (--dtype bfloat16), got {shape.dtype}"
    top = max_head_dim(platform)
    if shape.head_dim > top:
        arch = "compute capability 9.0+" if top == 256 else "compute capability < 9.0"
        return f"head dim {shape.head_dim} > {top} (cuDNN's limit on {arch})"
    if shape.head_dim % 8:
        return f"head dim {shape.head_dim} is not a multiple of 8 (cuDNN's limit)"
    if shape.window is not None:
        return "no two-sided local window in cuDNN (--window_size)"
    return None


def cudnn_available() -> bool:
    """True when this process's default JAX backend is an NVIDIA GPU cuDNN attention runs on."""
    return cudnn_limit(Platform.detect()) is None


def cudnn_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, scale: float) -> jax.Array:
    """cuDNN flash attention over ``(B, L, H, D)`` (for a shape :func:`cudnn_limit` accepts)."""
    return jax.nn.dot_product_attention(q, k, v, scale=scale, implementation="cudnn")
