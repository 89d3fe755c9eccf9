"""The ``cudnn`` backend: ``jax.nn.dot_product_attention(implementation="cudnn")`` on NVIDIA GPUs."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from wanjax.errors import ConfigError


def cudnn_available() -> bool:
    """True when the default JAX backend is an NVIDIA (CUDA) GPU."""
    if jax.default_backend() != "gpu":
        return False
    return "rocm" not in jax.devices()[0].client.platform_version.lower()


def cudnn_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, *, scale: float, window_size: int | None = None
) -> jax.Array:
    """cuDNN flash attention over ``(B, L, H, D)``; needs bfloat16 or float16 inputs."""
    if q.dtype not in (jnp.bfloat16, jnp.float16):
        raise ConfigError(
            f"attention backend 'cudnn' needs bfloat16 or float16 activations, got {q.dtype}; "
            "use --dtype bfloat16 or --attention xla"
        )
    window = None if window_size is None else (window_size, window_size)
    return jax.nn.dot_product_attention(
        q, k, v, scale=scale, local_window_size=window, implementation="cudnn"
    )
