"""The Wan 2.1 and 2.2 causal 3D VAEs (``AutoencoderKLWan``): chunked, static-shape decode and encode.

Both run through the same layer plans, causal cache and scan; the Wan 2.2 VAE (``is_residual``,
``patch_size``) adds residual blocks with parameter-free shortcuts and pixel patches at its edges.

The modules, by job: :mod:`~wanjax.models.vae.config` (``config.json`` and the layer plan),
:mod:`~wanjax.models.vae.layout` (checkpoint layout), :mod:`~wanjax.models.vae.ops`,
:mod:`~wanjax.models.vae.causal_conv`, :mod:`~wanjax.models.vae.upsampling`,
:mod:`~wanjax.models.vae.shortcuts` and :mod:`~wanjax.models.vae.blocks` (the network, one chunk at a
time), :mod:`~wanjax.models.vae.scan` (chunked decode/encode as ``lax.scan``),
:mod:`~wanjax.models.vae.tiling` (tiled decode),
:mod:`~wanjax.models.vae.postprocess` (latent normalisation, patches, ``uint8`` frames),
:mod:`~wanjax.models.vae.functional` (pure entry points), :mod:`~wanjax.models.vae.programs` (their
compiled programs) and :mod:`~wanjax.models.vae.model` (:class:`WanVAE`, :func:`load_vae`).
This package re-exports their public names.
"""

from wanjax.models.vae.config import VAEConfig, decoder_plan, encoder_plan
from wanjax.models.vae.functional import decode, decode_uint8, encode
from wanjax.models.vae.layout import VAE, checkpoint_spec
from wanjax.models.vae.model import CHILD_COMPILE_MIN_PIXELS, WanVAE, load_vae
from wanjax.models.vae.ops import Numerics
from wanjax.models.vae.postprocess import (
    clamp,
    denormalize_latents,
    normalize_latents,
    patchify,
    to_uint8,
    unpatchify,
)
from wanjax.models.vae.scan import decode_frames, encode_frames, parse_chunk
from wanjax.models.vae.tiling import Tiling, decode_frames_tiled

__all__ = [
    "CHILD_COMPILE_MIN_PIXELS",
    "VAE",
    "Numerics",
    "Tiling",
    "VAEConfig",
    "WanVAE",
    "checkpoint_spec",
    "clamp",
    "decode",
    "decode_frames",
    "decode_frames_tiled",
    "decode_uint8",
    "decoder_plan",
    "denormalize_latents",
    "encode",
    "encode_frames",
    "encoder_plan",
    "load_vae",
    "normalize_latents",
    "parse_chunk",
    "patchify",
    "to_uint8",
    "unpatchify",
]
