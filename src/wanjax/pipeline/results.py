"""What a run returns: the final latents and how the denoising went (:class:`Denoised`), the video with
its timings (:class:`Video`). Nothing of a run is left behind on the pipeline."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from wanjax.errors import NumericalError
from wanjax.parallel.layouts import to_host
from wanjax.pipeline.step_cache import CacheReport
from wanjax.runtime.timing import StageTiming, StepTimes


@dataclasses.dataclass(frozen=True)
class Denoised:
    """What a denoising run returns: the final latents and how the run went."""

    latents: jax.Array  # float32, the transformer's normalised latents
    step_times: StepTimes
    cache_report: CacheReport | None = None  # what a step cache decided (None without one)
    expert_steps: tuple[int, ...] = ()  # which expert ran each step (0: the first)
    mesh_usage: str | None = None  # how the run used each mesh axis (None: one device)
    finite_flags: tuple[jax.Array, ...] = dataclasses.field(default=(), repr=False)  # per step, on device

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


@dataclasses.dataclass(frozen=True)
class Video:
    """What ``WanPipeline(...)(prompt)`` returns: ``uint8 [B, T, H, W, 3]`` frames (one video per
    prompt), the denoising's result and the run's load / compile / run seconds per stage."""

    frames: np.ndarray
    denoised: Denoised
    timings: dict[str, StageTiming]
    clips: dict[str, Any] | None = None  # a long video made clip by clip: what each clip did (extension.py)

    @property
    def latents(self) -> jax.Array:
        return self.denoised.latents
