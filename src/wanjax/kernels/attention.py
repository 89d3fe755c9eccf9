"""The one attention entry point of wanjax.

``attention(q, k, v)`` takes ``(B, L, H, D)`` queries/keys/values (no mask: Wan attends to every
key) and returns ``(B, Lq, H, D)`` in the query dtype. ``backend`` is a name or an
:class:`AttentionSpec` (name plus options):

* ``xla``: portable matmuls, blockwise online softmax at long lengths (bounded memory); runs
  any shape and dtype;
* ``cudnn``: cuDNN flash attention, NVIDIA GPUs only, for the shapes cuDNN runs (16-bit inputs, head
  dim a multiple of 8 and at most 256 on Hopper, no window: see :func:`wanjax.kernels.cudnn.cudnn_limit`);
* ``splash``: JAX's Pallas TPU splash attention;
* ``splash_exp2``: our Pallas TPU kernel with exp2 and an inner kv compute loop (the seed's custom
  kernel, ``--use_custom_attention``);
* ``auto``: per call, the first backend of the platform's :data:`PREFERENCE` that can run the call's
  :class:`AttentionShape` (GPU: ``cudnn``, else ``xla``, e.g. for the VAE's one 384-dim head or
  float32; TPU: ``splash`` up to 256-dim heads, else ``xla``; elsewhere ``xla``).

The choice is :func:`resolve_backend`, a pure function of the backend name, the call's shape and the
:class:`Platform` (this process's unless one is given: tests simulate a GPU on a CPU). A backend asked
for by name that cannot run a call is a :class:`ConfigError` naming the limit; :func:`check_backend`
raises it before any work (the command line's pre-flight). Each call runs in a named scope,
:meth:`AttentionShape.label` (its ops are named ``attention_cudnn_B1_Lq32760_...`` in profiles).

The TPU kernels run anywhere: without a TPU, in Pallas interpret mode (with a warning; slow, for
testing). They pad lengths to whole blocks (the padding masked) and the head dim to 128 lanes, so
they take any shape.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType

import jax
import jax.numpy as jnp

from wanjax.errors import ConfigError
from wanjax.kernels import tuning
from wanjax.kernels.block_mask import BlockMask
from wanjax.kernels.common import AttentionProblem, AttentionShape, InterpretModeWarning, Platform
from wanjax.kernels.cudnn import cudnn_attention, cudnn_limit
from wanjax.kernels.precision import Precision
from wanjax.kernels.xla import DENSE_LIMIT, xla_attention
from wanjax.target import current_target

__all__ = [
    "BACKENDS",
    "DENSE_LIMIT",
    "PREFERENCE",
    "AttentionShape",
    "AttentionSpec",
    "InterpretModeWarning",
    "Platform",
    "attention",
    "available",
    "backend_limit",
    "check_backend",
    "resolve_backend",
]

BACKENDS = ("auto", "xla", "cudnn", "splash", "splash_exp2")
TPU_KERNELS = ("splash", "splash_exp2")
# What ``auto`` tries per platform, fastest first; ``xla`` (last everywhere) runs anything.
PREFERENCE: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"gpu": ("cudnn", "xla"), "tpu": ("splash", "xla")}
)


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    """An attention backend and its options (hashable: usable as a static jit argument).

    ``block_*``: TPU kernel blocks (``--bqsize --bkvsize --bkvcomputesize --bkvcomputeinsize``,
    multiples of 128 that nest); ``None`` takes the tune cache's entry for the shape on the target's
    device kind, else that kind's ``tuning.default_blocks``. ``k_smooth`` subtracts the mean key over
    the sequence first (exact: it shifts each query's scores by a constant). ``window_size`` limits
    self-attention (``Lq == Lk``) to keys ``|i - j| <= window_size``; cross-attention stays global.
    ``tune_file`` overrides the cache's location. ``block_mask``: a block-sparse self-attention mask
    (:class:`~wanjax.kernels.block_mask.BlockMask`, e.g. radial attention's): every call with this
    spec is self-attention over its length (the caller passes it for self-attention only); ``xla``
    computes the kept key blocks only, the splash kernels skip the empty blocks, ``cudnn`` (which
    cannot take it) runs the ``xla`` form.
    """

    backend: str = "auto"
    block_q: int | None = None
    block_kv: int | None = None
    block_kv_compute: int | None = None
    block_kv_compute_in: int | None = None
    k_smooth: bool = False
    window_size: int | None = None
    tune_file: str | None = None
    block_mask: BlockMask | None = None

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ConfigError(
                f"unknown attention backend {self.backend!r}; available: {', '.join(available())}"
            )
        if self.window_size is not None and self.window_size < 0:
            raise ConfigError(f"attention window_size must be >= 0, got {self.window_size}")
        if self.window_size is not None and self.block_mask is not None:
            raise ConfigError(
                "a local window (--window_size) and sparse attention cannot be combined; use one"
            )

    def blocks(self, key: str) -> tuning.Blocks:
        """The four kernel blocks: the ones given, the rest from the tune cache or the defaults."""
        path = None if self.tune_file is None else Path(self.tune_file)
        found = tuning.lookup(key, tuning.device_kind(), path)
        given = (self.block_q, self.block_kv, self.block_kv_compute, self.block_kv_compute_in)
        return tuple(g if g is not None else f for g, f in zip(given, found, strict=True))  # type: ignore[return-value]


def backend_limit(backend: str, platform: Platform, shape: AttentionShape | None = None) -> str | None:
    """Why ``backend`` cannot run ``shape`` on ``platform`` (a phrase), or ``None`` when it can;
    without ``shape``, only whether it runs on ``platform`` at all. The rules of every backend:

    * ``cudnn``: :func:`wanjax.kernels.cudnn.cudnn_limit` (NVIDIA GPU >= sm80, 16-bit, head dim);
    * ``splash``/``splash_exp2``: :func:`tpu_kernel_limit` (head dim; lengths are padded to blocks,
      the head dim to 128 lanes, any float dtype; off TPU in interpret mode);
    * ``xla``: none.
    """
    if backend == "cudnn":
        return cudnn_limit(platform, shape)
    if backend in TPU_KERNELS:
        return tpu_kernel_limit(shape)
    return None


TPU_MAX_HEAD_DIM = 256


def tpu_kernel_limit(shape: AttentionShape | None) -> str | None:
    """Why the TPU kernels cannot run ``shape``: a head dim above :data:`TPU_MAX_HEAD_DIM`.

    Their VMEM per grid step grows with ``(bq + bkv) * head_dim``, and their blocks are tuned for the
    DiT's 128-dim bf16 heads (``(3328, 2816)``: ~15 MB of double-buffered q/k/v/output blocks and
    float32 scratch by their block specs), then fitted to a problem's lengths only. The VAE's one
    384-dim head over a 480p latent frame (6,240 tokens) keeps those blocks and, in float32, would need
    ~50 MB, past every TPU's default scoped VMEM (16 MiB v5e, 32 MiB v6e); the seed's TPU port ran
    the VAE's attention without a flash kernel too. So such heads go to ``xla`` (a small share of a
    decode: one attention at 1/8 resolution)."""
    if shape is not None and shape.head_dim > TPU_MAX_HEAD_DIM:
        return (
            f"head dim {shape.head_dim} > {TPU_MAX_HEAD_DIM} (the TPU kernels' blocks would not fit in VMEM)"
        )
    return None


def _platform(platform: Platform | None) -> Platform:
    return Platform.detect() if platform is None else platform


def available(platform: Platform | None = None) -> tuple[str, ...]:
    """Backends usable on ``platform`` (default: this process's) for some problem (TPU kernels
    everywhere: interpret mode off TPU)."""
    platform = _platform(platform)
    return tuple(b for b in BACKENDS if backend_limit(b, platform) is None)


def resolve_backend(
    name: str, shape: AttentionShape | None = None, *, platform: Platform | None = None
) -> str:
    """The concrete backend ``name`` runs ``shape`` with on ``platform`` (default: this process's).

    ``auto``: the first backend of the platform's :data:`PREFERENCE` that can run ``shape`` (without
    a shape: the first that runs on the platform at all). A named backend is returned as is if it
    can run ``shape``; ConfigError if the name is unknown, the backend unavailable on the platform,
    or unable to run ``shape`` (the message names the limit and what to use instead).
    """
    platform = _platform(platform)
    if name not in BACKENDS:
        raise ConfigError(f"unknown attention backend {name!r}; available: {', '.join(available(platform))}")
    if name == "auto":
        choices = PREFERENCE.get(platform.name, ("xla",))
        return next(b for b in choices if backend_limit(b, platform, shape) is None)
    reason = backend_limit(name, platform)
    if reason is not None:
        raise ConfigError(f"attention backend {name!r} {reason}; available: {', '.join(available(platform))}")
    reason = None if shape is None else backend_limit(name, platform, shape)
    if reason is not None:
        fallback = resolve_backend("auto", shape, platform=platform)
        raise ConfigError(f"--attention {name}: {reason}; use --attention {fallback} or auto")
    return name


def check_backend(
    backend: str | AttentionSpec, shapes: Iterable[AttentionShape], *, platform: Platform | None = None
) -> None:
    """ConfigError, before any work, when ``backend`` cannot run one of ``shapes`` on ``platform``
    (e.g. the transformer's self- and cross-attention shapes, from its config and dtype)."""
    name = backend.backend if isinstance(backend, AttentionSpec) else backend
    platform = _platform(platform)
    resolve_backend(name, platform=platform)
    for shape in shapes:
        resolve_backend(name, shape, platform=platform)


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
    precision: Precision = "highest",
) -> jax.Array:
    """Softmax attention ``softmax(q k^T * scale) v`` over ``(B, L, H, D)`` arrays.

    ``block_q``/``block_k`` override the spec's ``block_q``/``block_kv`` (for ``xla``: its query and
    key blocks, default 512 and 1024). ``dense_limit`` and ``per_head`` tune ``xla`` (see
    ``wanjax.kernels.xla``; ``per_head`` defaults to on for a CPU target only). ``precision``: float32 matmuls
    of ``xla`` (:mod:`wanjax.kernels.precision`; the other backends take 16-bit inputs only).
    """
    spec = backend if isinstance(backend, AttentionSpec) else AttentionSpec(backend)
    spec = dataclasses.replace(
        spec,
        block_q=spec.block_q if block_q is None else block_q,
        block_kv=spec.block_kv if block_k is None else block_k,
    )
    shape = AttentionShape.of(q, k, spec.window_size)
    name = resolve_backend(spec.backend, shape)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    with jax.named_scope(shape.label(name)):
        if spec.k_smooth:
            k = smooth_keys(k)
        mask = spec.block_mask
        if mask is not None:
            _check_mask(mask, q, k)
        if name == "xla" or (name == "cudnn" and mask is not None):
            per_head = current_target().platform == "cpu" if per_head is None else per_head
            return xla_attention(
                q,
                k,
                v,
                scale=scale,
                window_size=shape.window,
                block_q=spec.block_q or (512 if mask is None else SPARSE_QUERY_ROWS * mask.block),
                block_k=spec.block_kv or 1024,
                dense_limit=dense_limit,
                per_head=per_head,
                precision=precision,
                block_mask=mask,
            )
        if name == "cudnn":
            return cudnn_attention(q, k, v, scale=scale)
        blocks = spec.blocks(tuning.shape_key(name, q.shape[1], k.shape[1], q.shape[3], q.dtype.name))
        if mask is not None:
            blocks = masked_blocks(blocks)
        # Pallas kernels are imported on first use: Pallas/Mosaic add ~15 MiB to every process
        if name == "splash":
            from wanjax.kernels.splash import splash_attention as kernel
        else:
            from wanjax.kernels.splash_exp2 import splash_exp2_attention as kernel
        return kernel(AttentionProblem(q, k, v, scale, blocks, shape.window, mask))


MASKED_BLOCK = 512
# ``xla`` under a block mask: mask rows per query block (each over its rows' union of kept key blocks).
# Measured at 32,760 tokens, 5 heads on the CPU (BENCHMARKS.md, radial decay 1.0 / 0.2): 2 rows in
# 0.66 / 0.68 of dense, 1 row 1.35 / 1.26 (per-chunk overhead), 4 rows 0.96 / 1.05 (wider unions).
SPARSE_QUERY_ROWS = 2


def masked_blocks(blocks: tuning.Blocks) -> tuning.Blocks:
    """The TPU kernels' blocks under a block mask: at most :data:`MASKED_BLOCK` (still nesting).

    A kernel skips whole grid blocks only, and splash keeps every distinct partially kept grid block's
    element mask on the device. For the 14B 720p radial mask (decay 1.0, 40% of its 128-blocks kept)
    measured on the host with splash's own mask processing: grid blocks of 512 leave 45% empty and
    keep 110 partial masks (29 MB, 12 s to process); blocks of 1024 leave 21% empty and keep 442
    (463 MB, 30 s); the dense defaults (3328 x 2816) leave almost none and their partial masks
    exhausted this machine's 24 GB."""
    bq, bkv, bkv_compute, bkv_compute_in = (min(b, MASKED_BLOCK) for b in blocks)
    bkv_compute_in = bkv_compute_in if bkv_compute % bkv_compute_in == 0 else 128
    return bq, bkv, bkv_compute, bkv_compute_in


def _check_mask(mask: BlockMask, q: jax.Array, k: jax.Array) -> None:
    if k.shape[1] != mask.length or mask.q_offset + q.shape[1] > mask.length:
        raise ValueError(
            f"a block mask of {mask.length} tokens (queries from {mask.q_offset}) cannot apply to "
            f"{q.shape[1]} queries and {k.shape[1]} keys: pass it for self-attention only"
        )


def smooth_keys(k: jax.Array) -> jax.Array:
    """``k`` minus its mean over the sequence (per batch and head), computed in float32."""
    k32 = k.astype(jnp.float32)
    return (k32 - k32.mean(axis=1, keepdims=True)).astype(k.dtype)
