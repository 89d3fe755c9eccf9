"""The values of one run (``pipe(prompt, ...)``, ``pipe.denoise(...)``), as one typed object."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from wanjax.kernels.radial import RadialAttention
from wanjax.models.defaults import TEXT_LENGTH, Defaults
from wanjax.sampling.cache.step_cache import CacheConfig

__all__ = ["RunOptions"]


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """A run's values, diffusers' names; ``None``: the model's (its registry entry's :class:`Defaults`,
    as ``wanjax generate`` and the server fill them: :meth:`filled`).

    ``height``, ``width``, ``num_frames``: the video (with an image left out: that area with the
    image's aspect). ``num_inference_steps``, ``guidance_scale`` (CFG, skipped at ``<= 1``),
    ``flow_shift`` (None: the checkpoint's scheduler config), ``scheduler`` (``auto``: the
    checkpoint's; ``unipc``, ``euler``, ``distill``, ...: :mod:`wanjax.sampling.scheduler`), ``seed``
    (the noise, and a few-step sampler's re-noising draws). A two-expert model (Wan 2.2 A14B):
    ``guidance_scale_2`` for the low-noise expert (default ``guidance_scale``, as diffusers),
    ``boundary_ratio`` in place of the checkpoint's. ``cache``: a step-cache policy
    (:class:`~wanjax.sampling.cache.step_cache.CacheConfig`). Video to video: ``strength`` (the last
    ``int(steps * strength)`` steps run), ``fps`` (a video file's read rate). A VACE model:
    ``conditioning_scale`` (the control's weight, one or one per vace layer). An Animate model (as
    diffusers' ``WanAnimatePipeline``): ``mode`` (``animate``, ``replace``), ``segment_frame_length``
    and ``prev_segment_conditioning_frames`` (``num_frames`` left out: the pose video's).
    ``sparse_attention``: radial attention (:class:`~wanjax.kernels.radial.RadialAttention`; None:
    dense)."""

    height: int | None = None
    width: int | None = None
    num_frames: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    guidance_scale_2: float | None = None
    boundary_ratio: float | None = None
    flow_shift: float | None = None
    scheduler: str = "auto"
    seed: int | None = None
    cache: CacheConfig | None = None
    strength: float | None = None
    fps: float | None = None
    conditioning_scale: float | Sequence[float] | None = None
    max_sequence_length: int = TEXT_LENGTH
    mode: str | None = None
    segment_frame_length: int | None = None
    prev_segment_conditioning_frames: int | None = None
    sparse_attention: RadialAttention | None = None

    @classmethod
    def of(cls, options: RunOptions | None, values: dict[str, Any]) -> RunOptions:
        """``options`` (default: none given) with ``values`` (diffusers' keyword arguments) over it;
        TypeError naming an unknown one."""
        return dataclasses.replace(options or cls(), **values)

    def filled(self, defaults: Defaults, video: bool = False) -> RunOptions:
        """These options with what they leave out taken from ``defaults`` (the video's size stays
        open: it may follow an image's aspect), the strength too for video to video (``video``): the
        one place a run's defaults are filled in, for the Python API, the command line and the server."""
        given = lambda value, default: default if value is None else value  # noqa: E731
        return dataclasses.replace(
            self,
            num_frames=given(self.num_frames, defaults.frames),
            num_inference_steps=given(self.num_inference_steps, defaults.num_inference_steps),
            guidance_scale=given(self.guidance_scale, defaults.guidance_scale),
            seed=given(self.seed, defaults.seed),
            fps=given(self.fps, defaults.fps),
            conditioning_scale=given(self.conditioning_scale, defaults.conditioning_scale),
            strength=given(self.strength, defaults.strength) if video else self.strength,
            segment_frame_length=given(self.segment_frame_length, defaults.segment_frame_length),
            prev_segment_conditioning_frames=given(
                self.prev_segment_conditioning_frames, defaults.prev_segment_conditioning_frames
            ),
        )
