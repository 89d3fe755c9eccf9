"""What a denoising run returns: the final latents and how the run went (:class:`Denoised`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from wanjax.errors import NumericalError
from wanjax.parallel.layouts import to_host
from wanjax.runtime.timing import StepTimes
from wanjax.sampling.cache.step_cache import CacheCarry, CacheReport

__all__ = ["Denoised", "check_steps_finite"]


@dataclasses.dataclass(frozen=True)
class Denoised:
    """What a denoising run returns: the final latents and how the run went."""

    latents: jax.Array  # float32, the transformer's normalised latents
    step_times: StepTimes
    cache_report: CacheReport | None = None  # what a step cache decided (None without one)
    expert_steps: tuple[int, ...] = ()  # which expert ran each step (0: the first)
    mesh_usage: str | None = None  # how the run used each mesh axis (None: one device)
    finite_flags: tuple[jax.Array, ...] = dataclasses.field(default=(), repr=False)  # per step, on device
    sparse_steps: tuple[int, ...] = ()  # the steps that ran radial attention (0-based)
    sparse_attention: Any = None  # its RadialAttention (None: dense): blocks from its dense_block on
    cache_carry: CacheCarry | None = dataclasses.field(default=None, repr=False)  # TaylorSeer's, to go on

    def check_finite(self, dtype: Any) -> None:
        """Raise NumericalError when the latents are not finite, naming the first step that made them
        so: one device-to-host read of the last step's flag, all of them only on failure."""
        finite = self.finite_flags
        if finite and not bool(to_host(finite[-1])):
            check_steps_finite([bool(to_host(f)) for f in finite], dtype)


def check_steps_finite(finite: list[bool], dtype: Any) -> None:
    """Raise NumericalError naming the first step whose latents were not finite (if any)."""
    if all(finite):
        return
    first = finite.index(False) + 1
    hint = (
        "try --dtype float32"
        if jnp.dtype(dtype).itemsize < 4
        else "check the checkpoint's weights and inputs"
    )
    raise NumericalError(
        f"denoising produced NaN/inf latents, first at step {first} of {len(finite)} "
        f"(transformer dtype {jnp.dtype(dtype).name}); {hint}"
    )
