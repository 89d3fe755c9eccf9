"""The one attention entry point of wanjax.

``attention(q, k, v)`` takes ``(B, L, H, D)`` queries/keys/values (no mask: Wan attends to every
key) and returns ``(B, Lq, H, D)`` in the query dtype. ``backend`` is a name or an
:class:`AttentionSpec` (name plus options):

* ``xla``: portable matmuls, blockwise online softmax at long lengths (bounded memory); CPU default;
* ``cudnn``: cuDNN flash attention, NVIDIA GPUs only, 16-bit inputs; GPU default (float32: ``xla``);
* ``splash``: JAX's Pallas TPU splash attention; TPU default;
* ``splash_exp2``: our Pallas TPU kernel with exp2 and an inner kv compute loop (the seed's custom
  kernel, ``--use_custom_attention``);
* ``auto``: the platform's default.

The TPU kernels run anywhere: without a TPU, in Pallas interpret mode (with a warning; slow, for
testing). Lengths that are not multiples of the blocks are padded and the padding masked.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import jax
import jax.numpy as jnp

from wanjax.errors import ConfigError
from wanjax.kernels import tuning
from wanjax.kernels.common import AttentionProblem, InterpretModeWarning
from wanjax.kernels.cudnn import cudnn_attention, cudnn_available
from wanjax.kernels.xla import DENSE_LIMIT, xla_attention

__all__ = ["BACKENDS", "DENSE_LIMIT", "AttentionSpec", "InterpretModeWarning", "attention", "resolve_backend"]

BACKENDS = ("auto", "xla", "cudnn", "splash", "splash_exp2")
TPU_KERNELS = ("splash", "splash_exp2")


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    """An attention backend and its options (hashable: usable as a static jit argument).

    ``block_*``: TPU kernel blocks (``--bqsize --bkvsize --bkvcomputesize --bkvcomputeinsize``,
    multiples of 128 that nest); ``None`` takes the tune cache's entry for the shape on this device,
    else ``tuning.DEFAULT_BLOCKS``. ``k_smooth`` subtracts the mean key over the sequence first (exact:
    it shifts each query's scores by a constant). ``window_size`` limits self-attention (``Lq == Lk``)
    to keys ``|i - j| <= window_size``; cross-attention stays global. ``tune_file`` overrides the
    cache's location.
    """

    backend: str = "auto"
    block_q: int | None = None
    block_kv: int | None = None
    block_kv_compute: int | None = None
    block_kv_compute_in: int | None = None
    k_smooth: bool = False
    window_size: int | None = None
    tune_file: str | None = None

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ConfigError(
                f"unknown attention backend {self.backend!r}; available: {', '.join(available())}"
            )
        if self.window_size is not None and self.window_size < 0:
            raise ConfigError(f"attention window_size must be >= 0, got {self.window_size}")

    def blocks(self, key: str) -> tuning.Blocks:
        """The four kernel blocks: the ones given, the rest from the tune cache or the defaults."""
        path = None if self.tune_file is None else Path(self.tune_file)
        found = tuning.lookup(key, tuning.device_kind(), path)
        given = (self.block_q, self.block_kv, self.block_kv_compute, self.block_kv_compute_in)
        return tuple(g if g is not None else f for g, f in zip(given, found, strict=True))  # type: ignore[return-value]


def available() -> tuple[str, ...]:
    """Backends usable on this platform (TPU kernels everywhere: interpret mode off TPU)."""
    return tuple(b for b in BACKENDS if b != "cudnn" or cudnn_available())


def resolve_backend(name: str, dtype: jnp.dtype | None = None) -> str:
    """The concrete backend ``name`` runs on this platform; ConfigError if unknown or unavailable.

    ``auto``: ``splash`` on TPU, ``cudnn`` on NVIDIA GPUs for 16-bit ``dtype`` (cuDNN has no float32
    flash attention), else ``xla``.
    """
    if name not in available():
        problem = (
            f"unknown attention backend {name!r}"
            if name not in BACKENDS
            else f"attention backend {name!r} needs an NVIDIA GPU, unavailable on {jax.default_backend()}"
        )
        raise ConfigError(f"{problem}; available: {', '.join(available())}")
    if name != "auto":
        return name
    if jax.default_backend() == "tpu":
        return "splash"
    half = dtype is not None and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16)
    return "cudnn" if half and cudnn_available() else "xla"


def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    scale: float | None = None,
    backend: str | AttentionSpec = "auto",
    block_q: int | None = None,
    block_k: int | None = None,
    dense_limit: int = DENSE_LIMIT,
    per_head: bool | None = None,
) -> jax.Array:
    """Softmax attention ``softmax(q k^T * scale) v`` over ``(B, L, H, D)`` arrays.

    ``block_q``/``block_k`` override the spec's ``block_q``/``block_kv`` (for ``xla``: its query and
    key blocks, default 512 and 1024). ``dense_limit`` and ``per_head`` tune ``xla`` (see
    ``wanjax.kernels.xla``; ``per_head`` defaults to on for CPU only).
    """
    spec = backend if isinstance(backend, AttentionSpec) else AttentionSpec(backend)
    spec = dataclasses.replace(
        spec,
        block_q=spec.block_q if block_q is None else block_q,
        block_kv=spec.block_kv if block_k is None else block_k,
    )
    name = resolve_backend(spec.backend, q.dtype)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    window = spec.window_size if q.shape[1] == k.shape[1] else None
    if spec.k_smooth:
        k = smooth_keys(k)

    if name == "xla":
        return xla_attention(
            q,
            k,
            v,
            scale=scale,
            window_size=window,
            block_q=spec.block_q or 512,
            block_k=spec.block_kv or 1024,
            dense_limit=dense_limit,
            per_head=jax.default_backend() == "cpu" if per_head is None else per_head,
        )
    if name == "cudnn":
        return cudnn_attention(q, k, v, scale=scale, window_size=window)
    blocks = spec.blocks(tuning.shape_key(name, q.shape[1], k.shape[1], q.shape[3], q.dtype.name))
    # Pallas kernels are imported on first use: Pallas/Mosaic add ~15 MiB to every process
    if name == "splash":
        from wanjax.kernels.splash import splash_attention as kernel
    else:
        from wanjax.kernels.splash_exp2 import splash_exp2_attention as kernel
    return kernel(AttentionProblem(q, k, v, scale, blocks, window))


def smooth_keys(k: jax.Array) -> jax.Array:
    """``k`` minus its mean over the sequence (per batch and head), computed in float32."""
    k32 = k.astype(jnp.float32)
    return (k32 - k32.mean(axis=1, keepdims=True)).astype(k.dtype)
