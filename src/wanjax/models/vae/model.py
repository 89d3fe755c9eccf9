"""The Wan 2.1 and 2.2 causal 3D VAEs (``AutoencoderKLWan``) as a loaded model: :class:`WanVAE` and
:func:`load_vae`.

Two latent conventions, never to be mixed up:

* **VAE latents** (``vae_latents``): what diffusers' ``vae.decode`` takes and ``vae.encode`` returns.
* **Normalised latents** (``normalized_latents``): what the transformer denoises and produces,
  ``(vae_latents - latents_mean) / latents_std`` per channel.

:class:`WanVAE` ``.decode`` takes VAE latents (diffusers' convention) and returns float video;
``.decode_uint8`` takes normalised latents (the transformer's output), de-normalises them as the
reference pipeline does (``latents / (1 / std) + mean``) and returns ``uint8 [B, T, H, W, 3]`` frames
computed on the device; ``.encode`` returns the posterior mean as VAE latents. How they run (a
chunked ``lax.scan`` with the causal cache as its carry, memory bounded whatever the length) is in
:mod:`wanjax.models.vae.scan`.

Compilation: each input shape gets one program (the scan's trip count is static); its size,
compile time (~4-5 s on CPU for the real VAE) and memory do not depend on the number of frames.
On the CPU, programs for frames of 256x256 pixels and more are compiled in a short-lived child
process and loaded from their serialized executables (:mod:`wanjax.runtime.child_compile`), which keeps
the ~100 MiB the compiler leaves behind out of this process; while the persistent compilation
cache is on, the executables are kept beside it, so the next run compiles nothing. Programs are kept per signature
(:mod:`wanjax.models.vae.programs`), and a part's weights are read only after its first program is
compiled (:class:`_Weights`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from wanjax.errors import ConfigError, NumericalError
from wanjax.io.checkpoint import ShardingFn, abstract_params, check_checkpoint, first_device, load_params
from wanjax.io.finite import check_finite
from wanjax.io.key_layouts import spec_names
from wanjax.kernels.precision import resolve_precision
from wanjax.models.config import parse_dtype
from wanjax.models.layers import Params
from wanjax.models.vae import programs
from wanjax.models.vae.config import VAEConfig, encoder_plan
from wanjax.models.vae.layout import VAE, checkpoint_spec
from wanjax.models.vae.ops import (
    CONV_IMPLS,
    FIRST_FRAME_IMPLS,
    UPSAMPLE_IMPLS,
    Numerics,
    default_conv,
    default_first_frame,
    f32_conv_output,
)
from wanjax.models.vae.postprocess import denormalize_latents, normalize_latents
from wanjax.models.vae.scan import first_in_scan, parse_chunk
from wanjax.models.vae.tiling import Tiling
from wanjax.runtime.programs import Signature, child_can_compile, release_free_heap, signature, unplaced
from wanjax.target import current_target

# Tiling and parse_chunk stay importable from here (``wanjax.jobs`` and ``wanjax.cli`` do)
__all__ = ["CHILD_COMPILE_MIN_PIXELS", "Tiling", "WanVAE", "load_vae", "parse_chunk"]

# Frames this large (pixels) have their programs compiled in a child process by default: there the
# decode's own memory is hundreds of MiB and the ~1.5 s a child costs is small beside its run time.
CHILD_COMPILE_MIN_PIXELS = 256 * 256


class _Weights:
    """A part's weights, or a function reading them on first use, and what programs are compiled
    for: their abstract tree if given (so compiling needs no weights), else the weights."""

    def __init__(self, source: Callable[[], Params] | Params | None, like: Params | None):
        self._source, self._like = source, like

    @functools.cached_property
    def value(self) -> Params:
        if self._source is None:
            raise ConfigError("this WanVAE was built without encoder weights")
        return self._source() if callable(self._source) else self._source

    @property
    def like(self) -> Params:
        return self.value if self._like is None else self._like


class WanVAE:
    """A loaded Wan 2.1 or 2.2 VAE. See the module docstring for the two latent conventions.

    * ``decode(vae_latents)``: ``(B, z, T', h, w)`` VAE latents (diffusers' ``vae.decode`` input)
      -> float video ``(B, 3, 1 + 4 (T'-1), H, W)`` in [-1, 1], in the activation dtype
      (``H = cfg.spatial_factor * h``: 8 for Wan 2.1, 16 for Wan 2.2; always clamped, as diffusers).
    * ``decode_uint8(normalized_latents)``: the transformer's output -> ``uint8 (B, T, H, W, 3)``.
    * ``encode(video)``: ``(B, 3, T, H, W)`` in [-1, 1] -> posterior mean ``(B, z, T', h, w)``
      (VAE latents; :meth:`normalize_latents` maps them to the transformer's space).

    Each method is compiled once per input shape. ``params`` and ``encoder_params`` are the weights
    or functions that read them on first use; with their abstract trees (``params_like``,
    ``encoder_like``: shapes, dtypes, shardings) a program is compiled before the weights it needs
    are read, so they take the heap the compiler freed (``load_vae`` does this).
    ``tiling`` (a :class:`Tiling`) decodes large frames in blended spatial tiles, as diffusers'
    ``enable_tiling()``. ``compile_in_child``: compile programs in a short-lived child process
    (:mod:`wanjax.runtime.child_compile`), which keeps the compiler's leftover heap (~100 MiB for the
    real VAE) out of this one; ``None`` (default): for frames of at least
    :data:`CHILD_COMPILE_MIN_PIXELS` pixels. Only on the CPU backend in one process, for unsharded
    inputs; a failing child falls back to compiling here (with a warning).
    ``precision``: of float32 convolutions and matmuls (``highest | high | default``; None: this
    platform's default, see :func:`~wanjax.kernels.precision.default_precision`).
    ``first_frame``: ``alone | scan`` (``auto``: the target's, see
    :func:`~wanjax.models.vae.ops.default_first_frame`).
    """

    def __init__(
        self,
        cfg: VAEConfig,
        params: Callable[[], Params] | Params,
        dtype: Any = jnp.float32,
        *,
        params_like: Params | None = None,
        encoder_params: Callable[[], Params] | Params | None = None,
        encoder_like: Params | None = None,
        decode_chunk: int | str | None = 1,
        encode_chunk: int | str | None = 1,
        frames_per_step: int = 1,
        conv: str = "auto",
        upsample: str = "subpixel",
        tiling: Tiling | None = None,
        compile_in_child: bool | None = None,
        precision: str | None = None,
        first_frame: str = "auto",
    ):
        precision = resolve_precision(precision, "vae")
        if conv == "auto":
            conv = default_conv(current_target().platform)
        if conv not in CONV_IMPLS:
            raise ConfigError(f"unknown conv formulation {conv!r}; use one of auto, {', '.join(CONV_IMPLS)}")
        if first_frame == "auto":
            first_frame = default_first_frame(current_target().platform)
        if first_frame not in FIRST_FRAME_IMPLS:
            raise ConfigError(
                f"unknown first_frame {first_frame!r}; use one of auto, {', '.join(FIRST_FRAME_IMPLS)}"
            )
        if upsample not in UPSAMPLE_IMPLS:
            raise ConfigError(
                f"unknown upsample formulation {upsample!r}; use one of {', '.join(UPSAMPLE_IMPLS)}"
            )
        if isinstance(frames_per_step, bool) or not isinstance(frames_per_step, int) or frames_per_step < 1:
            raise ConfigError(f"frames_per_step must be a positive integer, got {frames_per_step!r}")
        self.cfg = cfg
        self._weights = {
            "decoder": _Weights(params, params_like),
            "encoder": _Weights(encoder_params, encoder_like),
        }
        self.dtype = jnp.dtype(dtype)
        self.precision = precision
        self.numerics = Numerics(
            self.dtype,
            conv,
            upsample,
            precision=precision,
            f32_conv_output=f32_conv_output(current_target().platform),
            first_frame=first_frame,
        )
        self.decode_chunk = parse_chunk(decode_chunk, "decode_chunk")
        self.encode_chunk = parse_chunk(encode_chunk, "encode_chunk")
        if tiling is not None:
            try:
                tiling.check_stride(cfg.spatial_factor)
            except ConfigError as e:
                raise ConfigError(f"tiling {e}") from None
        self.frames_per_step = frames_per_step
        self.compile_in_child = compile_in_child
        opts = {"cfg": cfg, "nm": self.numerics, "frames": frames_per_step}
        self.tiling = tiling
        dec = {"chunk": self.decode_chunk, "tiling": tiling, **opts}
        enc = {"chunk": self.encode_chunk, **opts}
        self._statics = {
            name: tuple(sorted(kw.items()))
            for name, kw in (("decode", dec), ("decode_uint8", dec), ("encode", enc))
        }

    @property
    def params(self) -> Params:
        """The decoder's weights (read now if not yet)."""
        return self._weights["decoder"].value

    @property
    def encoder_params(self) -> Params:
        """The encoder's weights (read now if not yet)."""
        return self._weights["encoder"].value

    def decode(self, vae_latents: jax.Array) -> jax.Array:
        """VAE latents (diffusers ``vae.decode`` convention) -> float video ``(B, 3, T, H, W)``."""
        self._check_latents(vae_latents)
        return self._run("decode", vae_latents)

    def decode_uint8(
        self, normalized_latents: jax.Array, on_frames: Callable[[int, int], None] | None = None
    ) -> jax.Array:
        """Normalised latents (transformer output) -> ``uint8 (B, T, H, W, 3)`` frames; NumericalError
        when the decoder gave NaN or infinite values (which the cast to ``uint8`` would hide).

        ``on_frames(done, total)``: the decode runs in parts instead of one program, the first latent
        frame, then ``decode_chunk`` at a time, each part a call of its own, finished before
        ``on_frames`` is told how many latent frames are decoded (e.g. for a progress bar); the frames
        are the one program's bit for bit. Not for a tiled decode (one program, no calls)."""
        self._check_latents(normalized_latents)
        if on_frames is None or self._tiled(normalized_latents):
            frames, nonfinite = self._run("decode_uint8", normalized_latents)
        else:
            frames, nonfinite = self._decode_in_parts(jnp.asarray(normalized_latents), on_frames)
        if bad := int(nonfinite):
            dtype = jnp.dtype(self.numerics.dtype).name
            fix = (
                "decode with --vae_dtype float32"
                if dtype != "float32"
                else "check the VAE weights (a damaged or mismatched file) and the latents' range"
            )
            raise NumericalError(
                f"the VAE decoded {bad} NaN/inf value(s) of {frames.size} ({dtype} activations), "
                f"which uint8 frames would hide; {fix}"
            )
        return frames

    def encode(self, video: jax.Array) -> jax.Array:
        """Video ``(B, 3, T, H, W)`` in [-1, 1] -> posterior mean ``(B, z, T', h, w)`` (VAE latents)."""
        shape = tuple(video.shape)
        if len(shape) != 5 or shape[1] != self.cfg.video_channels or shape[2] < 1:
            raise ConfigError(f"video must be (B, {self.cfg.video_channels}, T, H, W), got {shape}")
        # patches need whole ones; the residual blocks' shortcuts halve H and W exactly at every level
        multiple = self.cfg.spatial_factor if self.cfg.is_residual else self.cfg.patch
        if shape[3] % multiple or shape[4] % multiple:
            raise ConfigError(
                f"this VAE encodes frames whose height and width are multiples of {multiple}, got {shape[3:]}"
            )
        if any(layer.kind == "attn" and "down_blocks" in layer.name for layer in encoder_plan(self.cfg)):
            # diffusers 0.42 (and the original Wan code) crash when encoding with attention blocks
            # in down_blocks, so there is no reference to be exact against.
            raise ConfigError(
                f"attn_scales={list(self.cfg.attn_scales)} puts attention in the encoder's down_blocks, "
                "which the reference cannot run; encoding such a checkpoint is not supported"
            )
        return self._run("encode", video)

    def lower(self, method: str, x: jax.Array | jax.ShapeDtypeStruct) -> jax.stages.Lowered:
        """The program ``method`` (``decode``, ``decode_uint8`` or ``encode``) runs for inputs shaped
        like ``x``; ``.compile().memory_analysis()`` gives its memory before running anything."""
        return programs.lower(method, self._statics_for(method, x), self._part(method).like, x)

    def compile(self, method: str, x: jax.Array) -> jax.stages.Compiled:
        """The compiled program ``method`` runs for ``x`` (compiled on first use, then cached);
        e.g. ``vae.compile("decode_uint8", latents).memory_analysis()``."""
        x = jnp.asarray(x)
        statics = self._statics_for(method, x)
        params_sig, x_sig = signature(self._part(method).like), (x.shape, x.dtype, x.sharding)
        in_child = self._compiles_in_child(method, x, params_sig)
        if in_child:  # one device: the default placement, which the child has too
            params_sig, x_sig = unplaced(params_sig), (x.shape, x.dtype, None)
        return programs.compiled(method, statics, params_sig, x_sig, in_child)

    def _compiles_in_child(self, method: str, x: jax.Array, params_sig: Signature) -> bool:
        """Whether ``method``'s program for ``x`` is compiled in a child process (see
        ``compile_in_child``): only for programs on the first device of a one-process CPU run."""
        if self.compile_in_child is False or not child_can_compile(params_sig, signature(x)):
            return False
        if self.compile_in_child:
            return True
        h, w = x.shape[-2:]
        scale = 1 if method == "encode" else self.cfg.spatial_factor**2
        return h * w * scale >= CHILD_COMPILE_MIN_PIXELS

    def _part(self, method: str) -> _Weights:
        return self._weights["encoder" if method == "encode" else "decoder"]

    def _statics_for(self, method: str, x: jax.Array | jax.ShapeDtypeStruct) -> programs.Statics:
        """The static arguments for ``x``: split over several devices, the causal convs keep input
        frames (the owed-sum cache saves memory on one device but costs more under the SPMD
        partitioner's halo exchanges)."""
        statics = self._statics[method]
        sharding = getattr(x, "sharding", None)
        if sharding is None or len(sharding.device_set) == 1:
            return statics
        nm = dataclasses.replace(self.numerics, owed_cache=False)
        return tuple((k, nm if k == "nm" else v) for k, v in statics)

    def _run(self, method: str, x: jax.Array) -> jax.Array:
        x = jnp.asarray(x)
        program = self.compile(method, x)  # before reading the weights, if not yet read
        return program(self._part(method).value, **{programs.INPUT[method]: x})

    def _tiled(self, latents: jax.Array) -> bool:
        """Whether the decode of ``latents`` goes in spatial tiles (:class:`Tiling`)."""
        return self.tiling is not None and self.tiling.applies(self.cfg, *latents.shape[3:5])

    def _decode_in_parts(
        self, x: jax.Array, on_frames: Callable[[int, int], None]
    ) -> tuple[jax.Array, jax.Array]:
        """``decode_uint8``'s frames and non-finite count, part by part (see :meth:`decode_uint8`);
        a last part shorter than the others is padded (causality makes that harmless) and trimmed.
        Where the scan decodes the first latent frame too (:func:`first_in_scan`), the parts start
        from a zero cache and one program decodes them all, the first included (of whose ``r``
        frames the first ``r - 1`` are skipped ones)."""
        statics = dict(self._statics_for("decode_uint8", x))
        params, total, r = self.params, x.shape[2], self.cfg.temporal_factor
        in_scan = first_in_scan(statics["nm"], statics["frames"])
        base = (("cfg", statics["cfg"]), ("nm", statics["nm"]))
        parts, nonfinite, done = [], jnp.zeros((), jnp.int32), 0
        if in_scan:
            chunk = total if self.decode_chunk is None else min(self.decode_chunk, total)
            cache = programs.compiled_part("decode_cache", base, params, x[:, :, :1])(params, x[:, :, :1])
        else:
            chunk = max(1, total - 1 if self.decode_chunk is None else min(self.decode_chunk, total - 1))
            base += (("frames", statics["frames"]),)
            first = x[:, :, :1]
            out, counts, cache = programs.compiled_part("decode_uint8_first", base, params, first)(
                params, first
            )
            parts, nonfinite, done = [jax.block_until_ready(out)], jnp.sum(counts, dtype=jnp.int32), 1
            on_frames(1, total)
        while done < total:
            n = min(chunk, total - done)
            part = jnp.pad(x[:, :, done : done + n], ((0, 0), (0, 0), (0, chunk - n), (0, 0), (0, 0)))
            args: tuple[Any, ...] = (params, cache, part)
            if in_scan:
                args += (jnp.asarray(done == 0),)
            name = "decode_uint8_part" if in_scan else "decode_uint8_next"
            out, counts, cache = programs.compiled_part(name, base, *args)(*args)
            skipped = r - 1 if in_scan and done == 0 else 0
            parts.append(jax.block_until_ready(out[:, skipped : r * n]))
            nonfinite += jnp.sum(counts[skipped : r * n], dtype=jnp.int32)
            done += n
            on_frames(done, total)
        return jnp.concatenate(parts, axis=1), nonfinite

    def normalize_latents(self, vae_latents: jax.Array) -> jax.Array:
        """VAE latents -> the transformer's normalised latents."""
        return normalize_latents(self.cfg, jnp.asarray(vae_latents))

    def denormalize_latents(self, normalized_latents: jax.Array) -> jax.Array:
        """The transformer's normalised latents -> VAE latents (as the reference pipeline)."""
        return denormalize_latents(self.cfg, jnp.asarray(normalized_latents))

    def _check_latents(self, latents: jax.Array) -> None:
        shape = tuple(latents.shape)
        if len(shape) != 5 or shape[1] != self.cfg.z_dim or shape[2] < 1:
            raise ConfigError(f"latents must be (B, {self.cfg.z_dim}, T', h, w), got {shape}")


def load_vae(
    path: str | Path,
    dtype: str | jnp.dtype = "float32",
    weights_dtype: str | jnp.dtype | None = None,
    *,
    sharding: ShardingFn | None = None,
    config: VAEConfig | None = None,
    **options: Any,
) -> WanVAE:
    """Load ``vae/`` of a diffusers-layout Wan 2.1 or 2.2 model (``path`` = model root or that folder),
    or one VAE weights file of any layout ``config`` describes.

    ``dtype``: activations; ``weights_dtype``: how the weights are stored (default: ``dtype``);
    weights are cast to ``dtype`` at use. ``sharding``: each weight's placement. ``options``:
    :class:`WanVAE`'s (``decode_chunk``, ``encode_chunk``, ``frames_per_step``, ``conv``,
    ``upsample``, ``tiling``, ``compile_in_child``, ``precision``, ``first_frame``).
    The checkpoint's names, shapes and dtypes are checked now; each part's weights are read on its
    first use, after that call's program is compiled.
    """
    cfg, stored = VAE.stored(path, config)
    dtype = parse_dtype(dtype)
    weights_dtype = parse_dtype(weights_dtype) if weights_dtype is not None else dtype
    check_checkpoint(stored.open(), stored.rename(checkpoint_spec(cfg)), stored.where, stored.ignore)

    def load(part: str) -> Params:
        """One part's weights; the files are mapped only while they are read."""
        other = "encoder" if part == "decoder" else "decoder"
        other_names = set(spec_names(stored.rename(checkpoint_spec(cfg, other))))
        params = load_params(
            stored.open(),
            stored.rename(checkpoint_spec(cfg, part)),
            weights_dtype,
            stored.where,
            sharding=sharding,
            ignore=lambda name: name in other_names or stored.ignore(name),
        )
        jax.block_until_ready(params)  # transfers done: the file mapping is released now
        release_free_heap()  # and the heap the reads used (~20 MiB of the real decoder's) returned
        check_finite(params, f"{stored.where} ({part})")
        return params

    def like(part: str) -> Params:
        return abstract_params(checkpoint_spec(cfg, part), weights_dtype, sharding or first_device)

    return WanVAE(
        cfg,
        lambda: load("decoder"),
        dtype,
        params_like=like("decoder"),
        encoder_params=lambda: load("encoder"),
        encoder_like=like("encoder"),
        **options,
    )
