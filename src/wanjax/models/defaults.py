"""What a run leaves out: the video and sampling values and the text length Wan was trained on.

Kept free of JAX, so the command line's flags read them before anything heavy is imported; each
registry entry (:mod:`wanjax.models.registry`) holds its own :class:`Defaults`.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Defaults:
    """Video and sampling values for what a run leaves out."""

    height: int = 480
    width: int = 832
    frames: int = 81
    fps: float = 16.0
    num_inference_steps: int = 50
    guidance_scale: float = 5.0
    seed: int = 42
    strength: float = 0.8  # video-to-video: diffusers' WanVideoToVideoPipeline default
    conditioning_scale: float = 1.0  # VACE: the control's weight, diffusers' WanVACEPipeline default
    # Animate: frames per segment and the previous segment's last frames each continues from,
    # diffusers' WanAnimatePipeline defaults
    segment_frame_length: int = 77
    prev_segment_conditioning_frames: int = 1
    scheduler: str = "auto"  # the checkpoint's scheduler config; a distilled model's own sampler


TEXT_LENGTH = 512  # Wan's text_len: the prompt tokens every Wan DiT was trained on (the authors' configs)
