"""``wanjax plan``: per-device memory of a run on a mesh, from abstract shapes (no weights, no devices).

Weights: every leaf's shard under the sharding rules (:mod:`wanjax.parallel.rules`), in the run's dtypes,
or with ``--weights_dtype int8|fp8`` each quantisable leaf (:mod:`wanjax.io.quantizable`) in 1 byte per
element plus a float32 scale per output channel, sharded as the kernel's output axis. Activations: an
analytic estimate of each stage's largest live set per device (DiT block under the token layout, text
encoder layer, VAE decoder at full resolution plus its causal cache under spatial sharding; with
8-bit weights, plus one layer's kernels dequantised to the model dtype). An Animate run is planned by
one segment and its step's reference frame, face pixels and face encoders (:mod:`wanjax.planning.animate`).

Where the weights are while each stage runs depends on ``--offload``:

- ``none``: all three components stay on the device; every stage adds its activations to all weights.
- ``model``: a component is on the device only while its stage runs (the others wait in host memory);
  a stage needs its own weights and activations, the peak is the largest stage. The text encoder,
  run once per stage, streams its stacked layers from host memory, two at a time (double-buffered).
- ``blocks``: as ``model``, and the DiT's stacked per-layer weights stay in host memory too, streamed
  in two layers at a time next to the DiT's other weights.

A plan fits when its peak stays within ``HEADROOM`` of the device memory (the rest is left to XLA's
temporaries). ``benchmarks/aot_memory.py`` checks the estimates against XLA's memory analysis of
the compiled programs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import numpy as np

from wanjax.chips import GiB
from wanjax.errors import WanjaxError
from wanjax.io.checkpoint import abstract_params
from wanjax.io.quantizable import (
    KEPT_GGUF,
    UNQUANTIZED,
)
from wanjax.io.quantizable import weights_dtype as weights_storage
from wanjax.models import clip_vision, umt5, vae
from wanjax.models.clip_vision import CLIPVisionConfig
from wanjax.models.config import parse_dtype
from wanjax.models.defaults import TEXT_LENGTH
from wanjax.models.offload import STREAMED_LAYERS, parse_offload, streams_layers
from wanjax.models.vae.config import VAEConfig
from wanjax.models.vae.ops import ACCELERATOR_CONV, Numerics
from wanjax.models.vae.scan import decoder_chunk, encoder_chunk
from wanjax.parallel.attention import sequence_mode
from wanjax.parallel.layouts import TokenLayout, strip_count, token_layout
from wanjax.parallel.mesh import MeshSpec
from wanjax.parallel.rules import per_device_param_bytes
from wanjax.pipeline.animate import segment_length
from wanjax.planning import animate
from wanjax.planning.models import Model
from wanjax.planning.weights import WeightBytes, copied_stack_bytes, transformer_bytes, weight_bytes
from wanjax.sampling.context_cache import cache_bytes, default_on
from wanjax.target import current_target

HEADROOM = 0.9


def size_text(size: float) -> str:
    """Bytes as GiB (MiB below one GiB)."""
    return f"{size / GiB:.2f} GiB" if size >= GiB else f"{size / 2**20:.1f} MiB"


ATTENTION_BLOCK = (512, 1024)  # the xla backend's query/key blocks


@dataclasses.dataclass
class StagePlan:
    weights: int  # bytes per device of this component's weights on the device while its stage runs
    activations: int  # bytes per device, estimated peak live activations
    stored: int = -1  # bytes per device of the whole component (default: ``weights``)
    streamed: int = 0  # of ``stored``, bytes per device held in host memory while the stage runs

    def __post_init__(self) -> None:
        if self.stored < 0:
            self.stored = self.weights


@dataclasses.dataclass
class Plan:
    mesh: MeshSpec
    stages: dict[str, StagePlan]
    device_memory: int
    layout: TokenLayout  # how the DiT's tokens are split over the mesh
    offload: str = "none"
    weights_dtype: str = UNQUANTIZED
    experts: int = 1
    shared: int = 0  # bytes in more than one stage's ``stored``: an image model's VAE (add_image_stage)
    latent_frames: int = 0  # the DiT step's latent frames (an Animate segment's and its reference's)

    def host_note(self, stage: str) -> str:
        """What of ``stage``'s component waits in host memory while it runs."""
        layers = f"layers streamed, {STREAMED_LAYERS} on device"
        if stage != "denoise" or self.experts == 1:
            return layers
        idle = "the idle expert (the experts swap at the boundary)"
        return idle if self.offload == "model" else f"{idle}; {layers}"

    @property
    def weights(self) -> int:
        """Bytes per device of every component's weights (each counted once)."""
        return sum(s.stored for s in self.stages.values()) - self.shared

    def on_device(self, stage: str) -> int:
        """Bytes per device while ``stage`` runs: its activations plus the weights on the device then
        (all of them with ``--offload none``, else the stage's own)."""
        s = self.stages[stage]
        return (self.weights if self.offload == "none" else s.weights) + s.activations

    @property
    def peak(self) -> int:
        """The largest :meth:`on_device` of the stages."""
        return max(self.on_device(name) for name in self.stages)

    @property
    def host(self) -> int:
        """Bytes per device of weights in host memory, the most at once (0 with ``--offload none``):
        the components whose stage is not running, plus the running one's streamed layers."""
        if self.offload == "none":
            return 0
        return max(self.weights - s.stored + s.streamed for s in self.stages.values())

    @property
    def mode(self) -> str:
        """The flags of the plan's offload and weights dtype."""
        return f"--offload {self.offload} --weights_dtype {self.weights_dtype}"

    @property
    def fits(self) -> bool:
        return self.peak <= HEADROOM * self.device_memory

    @property
    def block_devices(self) -> int:
        """Devices that exchange activations in every DiT block: those of one batch shard."""
        return self.mesh.num_devices // math.prod(self.mesh.sizes[a] for a in self.layout.batch)

    @property
    def roles(self) -> str:
        """What each axis of size > 1 splits, as `` (dp=2: batch, tp=4: heads)`` ("" on one device)."""
        roles = self.layout.describe({a: n for a, n in self.mesh.sizes.items() if n > 1})
        return f" ({roles})" if roles else ""

    def table(self) -> str:
        lines = [f"mesh {self.mesh}:"]
        for name, s in self.stages.items():
            line = (
                f"  {name:<8} weights {s.weights / GiB:7.2f} GiB   activations {s.activations / GiB:7.2f} GiB"
                f"   on device {self.on_device(name) / GiB:7.2f} GiB"
            )
            if s.streamed:
                line += f"   ({s.streamed / GiB:.2f} GiB in host memory: {self.host_note(name)})"
            lines.append(line)
        verdict = "fits" if self.fits else "does NOT fit"
        host = f", {self.host / GiB:.2f} GiB of host memory per device" if self.host else ""
        lines.append(
            f"  peak     {self.peak / GiB:7.2f} GiB per device of {self.device_memory / GiB:.0f} GiB "
            f"({HEADROOM:.0%} usable){host}: {verdict}"
        )
        return "\n".join(lines)


def component_stage(weights: WeightBytes, activations: int, stream: bool) -> StagePlan:
    """The stage running a component of these weights: all of them on the device, or with ``stream``
    the non-stacked ones and :data:`~wanjax.models.offload.STREAMED_LAYERS` layers (the rest in host memory)."""
    if not stream:
        return StagePlan(weights.total, activations)
    on_device = weights.fixed + min(STREAMED_LAYERS, weights.num_layers) * weights.layer
    return StagePlan(on_device, activations, weights.total, weights.stacked)


def plan(
    model: Model,
    mesh: MeshSpec,
    *,
    height: int,
    width: int,
    frames: int,
    device_memory: int,
    dtype: str = "bfloat16",
    vae_dtype: str = "float32",
    batch: int = 1,
    cfg: bool = True,
    max_sequence_length: int = TEXT_LENGTH,
    offload: str = "none",
    weights_dtype: str = UNQUANTIZED,
    lanes: int | None = None,
    copies_stacks: bool | None = None,
    segment_frame_length: int | None = None,
) -> Plan:
    """The plan of one run on ``mesh``; ``offload`` (:data:`OFFLOAD_MODES`) and ``weights_dtype``
    (:data:`~wanjax.io.quantizable.WEIGHTS_DTYPES`) as the flags of those names; ``lanes`` and
    ``copies_stacks``: the target's (:attr:`~wanjax.target.Target.lanes`,
    :attr:`~wanjax.target.Target.copies_16bit_stacks`; the devices built for when not given). An
    Animate model's run is sized by one segment of ``segment_frame_length`` frames (the model's
    default when not given; :mod:`wanjax.planning.animate`), whatever ``frames``."""
    offload = parse_offload(offload, "--offload")
    weights_storage(weights_dtype, "--weights_dtype")
    target = current_target()
    lanes = target.lanes if lanes is None else lanes
    copies_stacks = target.copies_16bit_stacks if copies_stacks is None else copies_stacks
    if weights_dtype == KEPT_GGUF and not model.gguf:
        raise WanjaxError(
            "--weights_dtype gguf keeps a GGUF file's quantised kernels, and no GGUF component file was "
            "given: pass --transformer FILE.gguf, or use bf16, int8 or fp8"
        )
    sizes = mesh.sizes
    act, vae_item = np.dtype(parse_dtype(dtype)).itemsize, np.dtype(parse_dtype(vae_dtype)).itemsize
    t = model.transformer
    d_bytes = transformer_bytes(
        t, parse_dtype(dtype), sizes, mesh.fsdp, weights_dtype, model.gguf.get("transformer")
    )
    e_spec = umt5.checkpoint_spec(model.text_encoder)
    e_bytes = weight_bytes(
        e_spec, parse_dtype(dtype), sizes, mesh.fsdp, weights_dtype, model.gguf.get("text_encoder")
    )
    v_spec = vae.checkpoint_spec(model.vae, "decoder")
    v_weights, _ = per_device_param_bytes(v_spec, parse_dtype(vae_dtype), sizes)

    # v7x: the compiler's second copy of the resident stacked 16-bit kernels, in its matmul tiling
    copied = 0
    if copies_stacks and not streams_layers(offload):
        kept = model.gguf.get("transformer")
        copied = copied_stack_bytes(
            t, parse_dtype(dtype), sizes, mesh.fsdp, weights_dtype, kept, default_on(offload)
        )

    # DiT: one block's live set per device.
    rows = batch * (2 if cfg else 1)
    v = model.vae
    if t.animate:  # one segment at a time, its step a latent frame longer (the reference's)
        segment = segment_frame_length or model.segment_frame_length or frames
        frames = segment_length(segment, v.temporal_factor)
        latent_t = animate.step_latent_frames(frames, v.temporal_factor)
    else:
        latent_t = (frames - 1) // v.temporal_factor + 1
    pt, ph, pw = t.patch_size
    f = v.spatial_factor  # video pixels per latent (16 for the Wan 2.2 VAE)
    length = (latent_t // pt) * (height // f // ph) * (width // f // pw)
    layout = token_layout(sizes, rows, length, t.num_attention_heads)

    def shards(axes: tuple[str, ...]) -> int:
        return math.prod(sizes[a] for a in axes)

    tokens = (rows // shards(layout.batch)) * math.ceil(length / shards(layout.seq))
    heads_local = t.num_attention_heads // shards(layout.heads)
    tp = sizes["tp"]
    ffn_local = t.ffn_dim // tp if t.ffn_dim % tp == 0 else t.ffn_dim
    # keys/values: all-gathered to the full length, or (Ulysses) full length over fewer heads
    gathered = sequence_mode(layout, sizes, t.num_attention_heads) == "allgather"
    kv_tokens = (rows // shards(layout.batch)) * length if gathered else tokens
    d = t.inner_dim
    # A block's live set: what lives through the whole step (its inputs and state), what lives
    # through the whole block, plus the larger of its two phases (the attention's buffers are dead
    # before the FFN's hidden is made).
    held = (
        4 * rows * v.z_dim * latent_t * (height // f) * (width // f) * 4  # scheduler state (replicated)
        + d_bytes.dequantized_layer  # 8-bit weights: one layer's kernels dequantised for its matmuls
        + copied  # v7x's copy of the stacked 16-bit kernels
        # the text K/V cache (every block's keys and values of the prompts), split as its reads
        + default_on(offload)
        * cache_bytes(t, rows, max_sequence_length, image_tokens(model), act)
        // (shards(layout.batch) * shards(layout.heads))
    )
    # the residual and the normed input, float32 norm / modulation temporaries; VACE: every control
    # block's hint, kept through the blocks
    throughout = tokens * d * (2 * act + 2 * 4) + len(t.vace_layers or ()) * tokens * d * act
    attention = (
        tokens * heads_local * t.attention_head_dim * act * 2  # q, attention output
        + kv_tokens * heads_local * t.attention_head_dim * act * 2
        + (rows // shards(layout.batch)) * heads_local * ATTENTION_BLOCK[0] * ATTENTION_BLOCK[1] * 4
    )
    ffn = tokens * ffn_local * (4 + act)  # the FFN's float32 first product and its GELU
    motion = 0  # Animate: its face pixels through the step; the face encoders' phase before the blocks
    if t.animate:
        held += animate.face_input(t, batch, frames)
        motion = animate.motion_phase(t, rows, frames, act, lanes)
    dit_act = held + max(throughout + max(attention, ffn), motion)

    # Text encoder: one layer on 2 * batch prompts.
    te = model.text_encoder
    te_rows = 2 * batch
    te_heads = te.num_heads // tp if te.num_heads % tp == 0 else te.num_heads
    te_ff = te.d_ff // tp if te.d_ff % tp == 0 else te.d_ff
    s = max_sequence_length
    te_act = te_rows * s * (te.d_model * (act + 4) * 2 + te_heads * s * 4 * 2 + 2 * te_ff * (act + 4))
    te_act += e_bytes.dequantized_layer

    # VAE decoder, split into strips as the pipeline splits its latents.
    c0 = lane_padded((v.decoder_base_dim or v.base_dim) * v.dim_mult[0], lanes)
    spatial = strip_count(mesh.sizes, (height // v.spatial_factor, width // v.spatial_factor))
    pixels = (height // v.patch) * (width // v.patch)  # the decoder's output: 2x2 patches in Wan 2.2
    cache = batch * vae_cache_bytes(v, height, width, vae_dtype, lanes)
    video = batch * frames * height * width * 3  # the decoded uint8 frames, the program's output
    vae_act = vae_live_bytes(cache, batch * pixels * c0 * vae_item, spatial) + video // spatial

    stages = {
        "encode": component_stage(e_bytes, te_act, streams_layers(offload, per_step=False)),
        "denoise": component_stage(d_bytes, dit_act, streams_layers(offload)),
        "decode": StagePlan(v_weights, vae_act),
    }
    if model.experts == 2:  # both experts resident, or (offload) the idle one in host memory
        d = stages["denoise"]
        idle = 0 if offload == "none" else d_bytes.total
        stages["denoise"] = StagePlan(
            d.weights + d_bytes.total - idle, d.activations, 2 * d.stored, d.streamed + idle
        )
    shared = 0
    if model.image:
        shared = add_image_stage(
            stages, model, sizes, mesh, (height, width, frames), vae_dtype, v_weights, lanes
        )
    return Plan(mesh, stages, device_memory, layout, offload, weights_dtype, model.experts, shared, latent_t)


def clip_activations(clip: CLIPVisionConfig, images: int) -> int:
    """Bytes of a CLIP layer's live set (float32) on ``images`` images: the residual, q/k/v/out, the
    attention scores and the MLP's hidden."""
    tokens, d = clip.num_positions, clip.hidden_size
    return (
        images * tokens * (4 * d * 4 * 2 + clip.num_attention_heads * tokens * 4 + clip.intermediate_size * 4)
    )


def image_tokens(model: Model) -> int:
    """The image-encoder tokens each forward row reads (a first-last-frame model's two images'), or 0."""
    t, clip = model.transformer, model.image_encoder
    if not t.image_tokens or clip is None:
        return 0
    return t.pos_embed_seq_len or clip.num_positions


def add_image_stage(
    stages: dict[str, StagePlan],
    model: Model,
    sizes: dict[str, int],
    mesh: MeshSpec,
    size: tuple[int, int, int],
    vae_dtype: str,
    decoder_weights: int,
    lanes: int,
) -> int:
    """An image-to-video model's extras, as ``WanPipeline`` runs them: in the encode stage the CLIP
    encoder (float32, sharded as UMT5; for a transformer taking its tokens) and the VAE, loaded there
    and resident after, whose encoder turns the conditioning video (the image, then black frames;
    split spatially over the devices as the decoder's latents) into latents. The stages after hold
    the VAE too. Returns the bytes that puts in more than one stage's ``stored`` (the VAE, held by
    all three stages: :attr:`Plan.shared`)."""
    height, width, frames = size
    clip = model.image_encoder
    clip_bytes = clip_act = 0
    if clip is not None:
        clip_bytes = weight_bytes(clip_vision.checkpoint_spec(clip), np.float32, sizes, mesh.fsdp).total
        clip_act = clip_activations(clip, 2 if model.transformer.first_last_frame else 1)
    v_spec = vae.checkpoint_spec(model.vae, "encoder")
    encoder_weights, _ = per_device_param_bytes(v_spec, parse_dtype(vae_dtype), sizes)
    v = model.vae
    item = np.dtype(parse_dtype(vae_dtype)).itemsize
    spatial = strip_count(mesh.sizes, (height, width))  # the conditioning video's strips
    video = frames * height * width * 3 * 4  # the float32 conditioning video
    frame = (height // v.patch) * (width // v.patch) * lane_padded(v.encoder_dims[0], lanes) * item
    cache = vae_encoder_cache_bytes(v, height, width, vae_dtype, lanes)
    encode_act = video // spatial + vae_live_bytes(cache, frame, spatial)
    vae_weights = decoder_weights + encoder_weights
    text = stages["encode"]
    stages["encode"] = StagePlan(
        text.weights + clip_bytes + vae_weights,
        max(text.activations, clip_act, encode_act),
        text.stored + clip_bytes + vae_weights,
        text.streamed,
    )
    for name in ("denoise", "decode"):  # the VAE stays where it was loaded
        s = stages[name]
        extra = vae_weights - (decoder_weights if name == "decode" else 0)
        stages[name] = StagePlan(s.weights + extra, s.activations, s.stored + extra, s.streamed)
    return 2 * vae_weights  # stored by the encode, denoise and decode stages: counted three times


def vae_live_bytes(cache: int, frame: int, strips: int) -> int:
    """Per-device live set of a VAE program split into ``strips`` spatial strips, from its causal
    cache (the dominant term; on accelerators a three-frame ring of every causal conv's input, ~1.5
    GiB per device for the 720p decode on 8) and one full-resolution ``frame``: one frame step holds
    six (input, output, residual, the norm's output, a conv's padded input and float32 result) and,
    when split, one whole frame the partitioner gathers (the scheduling dependency of the VAE's
    ``after``). Against XLA:CPU's buffer plans (BENCHMARKS.md) the 832x480 decode on one device:
    6.09 GiB planned, 6.01 compiled; 720p on 8 devices: 2.09 vs 1.93; against the TPU compiler's
    temporaries (channels padded to the lanes), 720p on 8 chips: 2.70 vs 2.89 (v6e), 3.01 (v5e)."""
    return (6 * frame + cache) // strips + (frame if strips > 1 else 0)


def lane_padded(channels: int, lanes: int) -> int:
    """``channels`` rounded up to a multiple of ``lanes`` (:attr:`~wanjax.target.Target.lanes`)."""
    return -(-channels // lanes) * lanes


def feature_bytes(tree: Any, lanes: int) -> int:
    """Bytes of the feature maps in ``tree`` (channels last) with their channels padded to ``lanes``."""
    total = 0
    for a in jax.tree.leaves(tree):
        shape = (*a.shape[:-1], lane_padded(a.shape[-1], lanes)) if a.ndim else ()
        total += math.prod(shape) * np.dtype(a.dtype).itemsize
    return total


@functools.lru_cache(maxsize=16)
def vae_cache_bytes(cfg: VAEConfig, height: int, width: int, dtype: str = "float32", lanes: int = 1) -> int:
    """Bytes of the decoder's causal cache for one ``height`` x ``width`` video in the accelerators'
    formulation (a three-frame ring of every causal conv's input), from the abstract first chunk
    (``jax.eval_shape``: no weights, no compute); channels padded to ``lanes``."""
    dt = parse_dtype(dtype)
    params = abstract_params(vae.checkpoint_spec(cfg, "decoder"), dt)
    f = cfg.spatial_factor
    z = jax.ShapeDtypeStruct((1, 1, height // f, width // f, cfg.z_dim), dt)
    nm = Numerics(dt, ACCELERATOR_CONV)
    _, cache = jax.eval_shape(lambda p, z: decoder_chunk(p, cfg, z, {}, True, nm, 1), params, z)
    return feature_bytes(cache, lanes)


@functools.lru_cache(maxsize=16)
def vae_encoder_cache_bytes(
    cfg: VAEConfig, height: int, width: int, dtype: str = "float32", lanes: int = 1
) -> int:
    """Bytes of the encoder's causal cache for one ``height`` x ``width`` video (as
    :func:`vae_cache_bytes`, from the abstract first chunk)."""
    dt = parse_dtype(dtype)
    params = abstract_params(vae.checkpoint_spec(cfg, "encoder"), dt)
    video = jax.ShapeDtypeStruct((1, 1, height, width, cfg.in_channels), dt)
    nm = Numerics(dt, ACCELERATOR_CONV)
    _, cache = jax.eval_shape(lambda p, x: encoder_chunk(p, cfg, x, {}, True, nm, 1), params, video)
    return feature_bytes(cache, lanes)


def parse_memory(text: str, flag: str = "--device_memory", zero: bool = False) -> int:
    """``32GiB``, ``16G``, ``80`` (GiB) -> bytes (``zero``: 0 allowed); WanjaxError naming ``flag``."""
    units = {"gib": GiB, "gb": GiB, "g": GiB, "mib": 1 << 20, "mb": 1 << 20, "m": 1 << 20, "": GiB}
    raw = text.strip().lower()
    number = raw.rstrip("abgim")
    unit = raw[len(number) :]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in units or value < 0 or (value == 0 and not zero):
        raise WanjaxError(f"bad {flag} {text!r}; write it like 32GiB or 16G")
    return int(value * units[unit])
