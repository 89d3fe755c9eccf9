"""What one segment of a Wan 2.2 Animate run holds, as ``plan`` sizes it: the run is made a segment
at a time (:mod:`wanjax.pipeline.animate`), so every stage's program is one segment's, whatever the
video's length. Its step reads one latent frame more than the segment's (the reference's, first),
and besides the DiT blocks holds the face video's pixels and, before the blocks run, the motion
encoder's feature maps of ``motion_encoder_batch_size`` face frames at a time
(:mod:`wanjax.models.animate`)."""

from __future__ import annotations

from wanjax.models.config import TransformerConfig
from wanjax.pipeline.animate import segment_length

__all__ = ["face_input", "motion_encoder_activations", "motion_phase", "step_latent_frames"]


def step_latent_frames(segment_frames: int, temporal: int) -> int:
    """The latent frames of an Animate step: the segment's and the reference's."""
    return (segment_length(segment_frames, temporal) - 1) // temporal + 1 + 1


def face_input(cfg: TransformerConfig, batch: int, segment_frames: int) -> int:
    """Bytes of the step's face pixels, float32, an input held through the step (replicated)."""
    assert cfg.motion_encoder_size is not None
    return batch * segment_frames * 3 * cfg.motion_encoder_size**2 * 4


def motion_phase(cfg: TransformerConfig, rows: int, segment_frames: int, act: int, lanes: int) -> int:
    """Bytes live while the face encoders run, before the blocks: every forward row's face pixels
    (the unconditional rows' all ``-1``) in float32 and in the model dtype, channels last, and
    :func:`motion_encoder_activations` (channels padded to ``lanes``)."""
    assert cfg.motion_encoder_size is not None
    pixels = rows * segment_frames * 3 * cfg.motion_encoder_size**2 * (4 + act)
    padded = -(-cfg.motion_channels[str(cfg.motion_encoder_size)] // lanes) * lanes
    return pixels + motion_encoder_activations(cfg, act, padded)


def motion_encoder_activations(cfg: TransformerConfig, act: int, padded: int) -> int:
    """Bytes of the motion encoder's largest live set: its first residual block on one batch of
    ``motion_encoder_batch_size`` face frames at full size, channels padded to the target's lanes
    (``padded``: its width, padded): two feature maps in the model dtype (the block's input, its
    first conv's output) and a byte per element for the rest (the strided convs' quarter-size
    outputs): 1.25 GiB for the 14B. Its :func:`motion_phase` on 2 x 77 face frames, 1.93 GiB, against
    the motion and face encoders compiled alone for a v6e chip (bf16): 1.70 GiB of temporaries and
    the 0.45 GiB of float32 pixels they take."""
    assert cfg.motion_encoder_size is not None and cfg.motion_encoder_batch_size is not None
    frame = cfg.motion_encoder_size**2 * padded
    return cfg.motion_encoder_batch_size * frame * (2 * act + 1)
