"""What one denoising step computes besides the scheduler: the transformer's inputs for the guided
batch (the conditional rows, then the unconditional ones; an image's or a VACE control's conditioning
joined), the classifier-free guidance of its prediction, and whether a batch's videos run one after
another."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from wanjax.models.dit import AnimateControl, DitInputs, VaceControl, WanTransformer
from wanjax.models.layers import Params
from wanjax.sampling.context_cache import ContextCache, guided_context

__all__ = [
    "ImageConditioning",
    "StepConditioning",
    "guide",
    "guided_batch",
    "guided_velocity",
    "is_first_frame",
    "one_by_one",
]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ImageConditioning:
    """What an image-to-video transformer reads besides the text, for every step: the conditioning
    latents ``(B, 20, T', h, w)`` (4 mask channels, then the VAE latents of the given frames)
    concatenated to the noisy latents along channels, and the image encoder's states ``(B, Li, Di)``
    (for a transformer that takes them). With ``first_frame`` (Wan 2.2 TI2V's ``expand_timesteps``)
    the latents are the image's own ``(B, z, 1, h, w)``: they replace the first latent frame of the
    transformer's input at every step (that frame's tokens at timestep 0) and of the final latents.
    Both branches of a guided step get the same (as diffusers' ``WanImageToVideoPipeline``). An
    Animate model's ``motion`` (pose latents, face pixels) goes with it; its unconditional branch
    reads the same pose and a face of all ``-1`` (as diffusers' ``WanAnimatePipeline``)."""

    latents: jax.Array
    image_embeds: jax.Array | None = None  # None: a transformer without image tokens (Wan 2.2 I2V)
    first_frame: bool = dataclasses.field(default=False, metadata={"static": True})
    motion: AnimateControl | None = None  # Animate: the pose latents and face pixels of every row

    def repeat(self, batch: int) -> ImageConditioning:
        """This conditioning (of one video) for ``batch`` videos: each array tiled ``batch`` times along
        its first axis, as diffusers repeats them (a first-last-frame model's two image states stay
        paired: ``[first, last, first, last, ...]``)."""
        states = None if self.image_embeds is None else jnp.tile(self.image_embeds, (batch, 1, 1))
        motion = (
            None
            if self.motion is None
            else jax.tree.map(lambda a: jnp.tile(a, (batch, 1, 1, 1, 1)), self.motion)
        )
        return ImageConditioning(
            jnp.tile(self.latents, (batch, 1, 1, 1, 1)), states, self.first_frame, motion
        )

    def impose(self, latents: jax.Array) -> jax.Array:
        """``first_frame``: ``latents`` with their first latent frame replaced by the image's (exactly
        diffusers' ``(1 - mask) * condition + mask * latents`` for its 0/1 mask)."""
        return latents.at[:, :, :1].set(self.latents.astype(latents.dtype))


StepConditioning = ImageConditioning | VaceControl  # what a step reads besides the text


def is_first_frame(conditioning: StepConditioning | None) -> bool:
    """The conditioning is an image standing in for the first latent frame (Wan 2.2 TI2V)."""
    return isinstance(conditioning, ImageConditioning) and conditioning.first_frame


def guided_batch(
    model: WanTransformer,
    latents: jax.Array,
    timestep: jax.Array,
    prompt_embeds: jax.Array,
    negative_prompt_embeds: jax.Array | None,
    image: StepConditioning | None = None,
    kv: ContextCache | None = None,
) -> DitInputs:
    """The transformer's inputs for one step: the conditional rows, then (guided) the unconditional
    ones; with ``image``, its latents joined to the noisy ones and its states for every row; with a
    VACE model's control, its latents for every row; an Animate model's motion, its pose for every row
    and its face for the conditional ones, all ``-1`` for the others; ``kv``: the run's text K/V cache
    of these rows (:mod:`~wanjax.sampling.context_cache`), or None."""
    batch = latents.shape[0]
    times = jnp.full((batch,), timestep)
    control: VaceControl | AnimateControl | None = None
    if isinstance(image, VaceControl):
        control, image = image, None
    elif image is not None and image.motion is not None:
        control = image.motion
    if image is None:
        x = latents
    elif image.first_frame:  # the image's latents as frame 0, whose tokens are at timestep 0
        x = image.impose(latents)
        times = jnp.full((batch, latents.shape[2]), timestep, jnp.float32).at[:, 0].set(0.0)
    else:
        x = jnp.concatenate([latents, image.latents.astype(latents.dtype)], axis=1)
    x = x.astype(model.dtype)
    embeds, images = guided_context(model, prompt_embeds, negative_prompt_embeds, image)
    if negative_prompt_embeds is None:
        return DitInputs(x, times, embeds, images, control, kv)
    if isinstance(control, VaceControl):
        control = VaceControl(jnp.concatenate([control.latents, control.latents]), control.scale)
    elif control is not None:
        face = control.face_pixels
        control = AnimateControl(
            jnp.concatenate([control.pose_latents, control.pose_latents]),
            jnp.concatenate([face, face * 0 - 1]),
        )
    return DitInputs(jnp.concatenate([x, x]), jnp.concatenate([times, times]), embeds, images, control, kv)


def guide(
    model: WanTransformer, velocity: jax.Array, batch: int, guidance_scale: float | jax.Array
) -> jax.Array:
    """``uncond + g * (cond - uncond)`` in the model dtype from the batched prediction (as it is
    when it holds only the conditional rows).

    Rounded as torch does it for the reference: the difference in the model dtype, the product with
    the (float32) scale rounded to the model dtype, then the sum.
    """
    if velocity.shape[0] == batch:
        return velocity
    cond, uncond = velocity[:batch], velocity[batch:]
    scaled = jnp.asarray(guidance_scale, jnp.float32) * (cond - uncond).astype(jnp.float32)
    return uncond + scaled.astype(model.dtype)


def guided_velocity(
    model: WanTransformer,
    params: Params,
    latents: jax.Array,
    timestep: jax.Array,
    prompt_embeds: jax.Array,
    negative_prompt_embeds: jax.Array | None,
    guidance_scale: float | jax.Array,
    image: StepConditioning | None = None,
    kv: ContextCache | None = None,
) -> jax.Array:
    """``uncond + g * (cond - uncond)`` in the model dtype (:func:`guide`); only the conditional pass
    without negatives. Both passes of a video run batched in one forward; the videos of a batch one
    after another (:func:`one_by_one`). ``kv``: the run's text K/V cache
    (:mod:`~wanjax.sampling.context_cache`), per video when they run one after another."""

    def forward(x: jax.Array, cond: jax.Array, uncond: jax.Array | None, image: Any, kv: Any) -> jax.Array:
        inputs = guided_batch(model, x, timestep, cond, uncond, image, kv)
        return guide(model, model.apply(params, inputs), x.shape[0], guidance_scale)

    if one_by_one(model, image):

        def alone(item: tuple[Any, ...]) -> jax.Array:
            *rows, cache = item
            x, cond, uncond = (None if v is None else v[None] for v in rows)
            return forward(x, cond, uncond, None, cache)[0]

        return jax.lax.map(alone, (latents, prompt_embeds, negative_prompt_embeds, kv))
    return forward(latents, prompt_embeds, negative_prompt_embeds, image, kv)


def one_by_one(model: WanTransformer, image: StepConditioning | None) -> bool:
    """Whether the step runs the batch's videos one after another (a lone video too, so both take the
    same program): a video is then computed exactly as when it runs alone. A larger forward may sum in
    another order (a backend picks its kernels by shape) and XLA may keep excess precision across
    what it fuses: in bfloat16 a batch's video drifted from its solo run by up to 14 levels in 3 steps
    of the demo model with guidance; this way they are equal bit for bit (tests/test_serve_batches.py).
    Not with image conditioning, nor across a ``dp`` axis (which splits the batch over devices)."""
    mesh = model.settings.mesh
    return image is None and (mesh is None or dict(mesh.shape).get("dp", 1) == 1)
