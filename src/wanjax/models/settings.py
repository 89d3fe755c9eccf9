"""How a model's forward runs, as one static value (a frozen, hashable dataclass, like the VAE's
:class:`~wanjax.models.vae.ops.Numerics`): passed whole through the forward functions and as a
static ``jit`` argument, in place of loose ``dtype``/``precision``/``mesh``/... keywords."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax.sharding import Mesh

from wanjax.kernels.attention import AttentionSpec
from wanjax.kernels.precision import Precision, parse_precision
from wanjax.kernels.radial import RadialAttention
from wanjax.models.config import parse_dtype
from wanjax.models.offload import Offload, parse_offload

__all__ = ["DEFAULT_SETTINGS", "RunSettings"]

FLOAT32 = jnp.dtype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """The static settings of a forward (normalised on construction: ``RunSettings("bf16")`` equals
    ``RunSettings(jnp.bfloat16)``, so equal settings hit the same compiled program).

    ``dtype``: of the activations (and the result). ``precision``: of float32 matmuls (see
    :mod:`wanjax.kernels.precision`; a loader resolves None to the platform's default).
    ``attention``: the attention backend's name or :class:`~wanjax.kernels.attention.AttentionSpec`.
    ``mesh``: run sharded over it (None: one device). ``offload``: where the weights lie while the
    forward runs (:mod:`wanjax.models.offload`). ``int8_matmuls``: the DiT blocks' attention and FFN
    matmuls multiply int8 x int8 (W8A8, :mod:`wanjax.models.w8a8`; int8 or GGUF kernels only).
    ``sparse``: radial attention in the self-attention of the blocks from its ``dense_block`` on
    (:class:`~wanjax.kernels.radial.RadialAttention`; None: dense; the sampler sets it for the sparse
    steps)."""

    dtype: jnp.dtype = FLOAT32
    precision: Precision = "highest"
    attention: str | AttentionSpec = "auto"
    mesh: Mesh | None = None
    offload: Offload = "none"
    int8_matmuls: bool = False
    sparse: RadialAttention | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", parse_dtype(self.dtype))
        object.__setattr__(self, "precision", parse_precision(self.precision))
        object.__setattr__(self, "offload", parse_offload(self.offload))


DEFAULT_SETTINGS = RunSettings()  # float32, exact float32 matmuls, the default backend, one device
