"""The precision of float32 compute: one setting per model, passed explicitly (static, like dtype).

``highest | high | default`` are JAX's :class:`jax.lax.Precision` names. They matter only for
float32 operands: 16-bit ones are multiplied exactly by every backend (float32 accumulation), so a
16-bit matmul or convolution carries no precision attribute whatever the setting.

* ``highest``: exact float32 (TPU: a 6-pass bf16 emulation; GPU: no TF32);
* ``high``: TPU: 3-pass bf16 (``bf16_3x``, about 16 significant bits per operand); GPU: TF32;
* ``default``: the hardware's fast path (TPU: one bf16 pass; GPU: TF32 tensor cores).
  CPUs compute float32 exactly at every setting.

:func:`default_precision` picks per platform and component (see its docstring for why).
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

from wanjax.errors import ConfigError
from wanjax.target import current_target

__all__ = [
    "COMPONENTS",
    "PRECISIONS",
    "Precision",
    "default_precision",
    "lax_precision",
    "parse_precision",
    "resolve_precision",
]

Precision = Literal["highest", "high", "default"]
PRECISIONS: tuple[Precision, ...] = ("highest", "high", "default")
COMPONENTS = ("transformer", "text_encoder", "vae")

_LAX = {
    "highest": jax.lax.Precision.HIGHEST,
    "high": jax.lax.Precision.HIGH,
    "default": jax.lax.Precision.DEFAULT,
}


def parse_precision(value: str) -> Precision:
    """``"highest"``/``"HIGH"``/... -> the setting's name; ConfigError for anything else."""
    name = value.lower() if isinstance(value, str) else None
    if name not in _LAX:
        raise ConfigError(f"unknown precision {value!r}; use one of {', '.join(PRECISIONS)}")
    return name  # type: ignore[return-value]


def lax_precision(precision: Precision, dtype: jnp.dtype) -> jax.lax.Precision | None:
    """The ``precision=`` argument of a matmul/convolution with ``dtype`` operands under this
    setting: None (no attribute) unless the operands are float32."""
    return _LAX[precision] if jnp.dtype(dtype) == jnp.float32 else None


def default_precision(platform: str, component: str) -> Precision:
    """The float32 precision ``component`` (``transformer``, ``text_encoder``, ``vae``) runs at by
    default on ``platform`` (a target's: ``cpu``, ``gpu``/``cuda``/``rocm``, ``tpu``).

    * CPU: ``highest`` everywhere -- exact, and it costs nothing (XLA:CPU has no faster float32).
    * GPU: as torch does by default. Its float32 matmuls are exact
      (``torch.backends.cuda.matmul.allow_tf32=False``) but its cuDNN convolutions use TF32
      (``torch.backends.cudnn.allow_tf32=True``): so the transformer and text encoder (all matmuls)
      run ``highest`` and the VAE (all convolutions) ``default`` -- TF32, ~4x faster, frames within
      2 uint8 levels of the exact decode (1 measured at 480p on an H100).
    * TPU: the transformer and text encoder ``highest`` (they default to bf16, where the setting
      only touches the small float32 time embedder; a float32 run is asked for to be exact), the
      VAE ``high``: it runs float32 by default and decoding is a large share of a run;
      ``highest`` costs 6 bf16 passes, ``high`` 3 with ~16 significant bits per operand (more than
      the GPU's TF32, so within the same 2-level bound), while ``default`` (one bf16 pass) rounds
      every operand to bf16 -- a bf16 decode, measured 5 levels off on GPU.
    """
    if component not in COMPONENTS:
        raise ConfigError(f"unknown component {component!r}; use one of {', '.join(COMPONENTS)}")
    platform = platform.lower()
    if platform in ("gpu", "cuda", "rocm"):
        return "default" if component == "vae" else "highest"
    if platform == "tpu":
        return "high" if component == "vae" else "highest"
    return "highest"


def resolve_precision(precision: str | None, component: str, platform: str | None = None) -> Precision:
    """``precision`` parsed, or (None) ``component``'s default on ``platform`` (default: the build
    target's, :func:`~wanjax.target.current_target`)."""
    if precision is not None:
        return parse_precision(precision)
    return default_precision(platform or current_target().platform, component)
