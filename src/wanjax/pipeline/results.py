"""What ``WanPipeline(...)(prompt)`` returns: the video with its denoising's result and timings
(:class:`Video`). Nothing of a run is left behind on the pipeline."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from wanjax.runtime.timing import StageTiming
from wanjax.sampling.results import Denoised

__all__ = ["Video"]


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
