"""``wanjax plan``: per-device memory of a run on a mesh, from abstract shapes (no weights, no devices).

Weights: every leaf's shard under the sharding rules (:mod:`wanjax.parallel.rules`), in the run's dtypes;
the pipeline keeps all three components loaded, so they add up. Activations: an analytic estimate of
each stage's largest live set per device (DiT block under the token layout, text encoder layer, VAE
decoder at full resolution plus its causal cache under spatial sharding). A mesh fits when weights
+ the largest activation stay within ``HEADROOM`` of the device memory (the rest is left to XLA's
temporaries). ``benchmarks/aot_memory.py`` checks the estimates against XLA's memory analysis of
the compiled programs.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from pathlib import Path
from typing import Any

import jax
import numpy as np

from wanjax.errors import WanjaxError
from wanjax.io.checkpoint import abstract_params
from wanjax.io.component import Component
from wanjax.models import dit, umt5, vae
from wanjax.models.config import PRESETS, TransformerConfig, parse_dtype
from wanjax.models.dit import TRANSFORMER
from wanjax.models.umt5 import TEXT_ENCODER, UMT5Config
from wanjax.models.vae.config import VAEConfig
from wanjax.models.vae.ops import Numerics
from wanjax.models.vae.scan import decoder_chunk
from wanjax.parallel.attention import sequence_mode
from wanjax.parallel.layouts import TokenLayout, token_layout
from wanjax.parallel.mesh import MeshSpec, auto_mesh
from wanjax.parallel.rules import per_device_param_bytes

HEADROOM = 0.9
GiB = 1 << 30
UMT5_XXL = UMT5Config(vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64)
ATTENTION_BLOCK = (512, 1024)  # the xla backend's query/key blocks


@dataclasses.dataclass(frozen=True)
class Model:
    transformer: TransformerConfig
    text_encoder: UMT5Config
    vae: VAEConfig


def model_configs(model: str) -> Model:
    """A preset name (``1.3B``, ``14B``: with UMT5-XXL and the Wan 2.1 VAE) or a diffusers directory."""
    if model in PRESETS:
        return Model(PRESETS[model], UMT5_XXL, VAEConfig())
    root = Path(model)
    if not (root / TRANSFORMER.folder / TRANSFORMER.config_file).is_file():
        raise WanjaxError(
            f"--model {model!r} is neither a preset ({', '.join(PRESETS)}) nor a diffusers model directory "
            "with transformer/config.json"
        )

    def read(component: Component, default: Any) -> Any:
        folder = root / component.folder
        return component.read_config(folder) if (folder / component.config_file).is_file() else default

    return Model(
        TRANSFORMER.read_config(root / TRANSFORMER.folder),
        read(TEXT_ENCODER, UMT5_XXL),
        read(vae.VAE, VAEConfig()),
    )


@dataclasses.dataclass
class StagePlan:
    weights: int  # bytes per device, this component's weights
    activations: int  # bytes per device, estimated peak live activations


@dataclasses.dataclass
class Plan:
    mesh: MeshSpec
    stages: dict[str, StagePlan]
    device_memory: int
    layout: TokenLayout  # how the DiT's tokens are split over the mesh

    @property
    def weights(self) -> int:
        return sum(s.weights for s in self.stages.values())

    @property
    def peak(self) -> int:
        """All weights resident plus the largest stage's activations."""
        return self.weights + max(s.activations for s in self.stages.values())

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
            lines.append(
                f"  {name:<8} weights {s.weights / GiB:7.2f} GiB   activations {s.activations / GiB:7.2f} GiB"
            )
        verdict = "fits" if self.fits else "does NOT fit"
        lines.append(
            f"  peak     {self.peak / GiB:7.2f} GiB per device of {self.device_memory / GiB:.0f} GiB "
            f"({HEADROOM:.0%} usable): {verdict}"
        )
        return "\n".join(lines)


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
    max_sequence_length: int = 512,
) -> Plan:
    sizes = mesh.sizes
    act, vae_act = np.dtype(parse_dtype(dtype)).itemsize, np.dtype(parse_dtype(vae_dtype)).itemsize
    t = model.transformer
    d_weights, _ = per_device_param_bytes(dit.checkpoint_spec(t), parse_dtype(dtype), sizes, mesh.fsdp)
    e_spec = umt5.checkpoint_spec(model.text_encoder)
    e_weights, _ = per_device_param_bytes(e_spec, parse_dtype(dtype), sizes, mesh.fsdp)
    v_spec = vae.checkpoint_spec(model.vae, "decoder")
    v_weights, _ = per_device_param_bytes(v_spec, parse_dtype(vae_dtype), sizes)

    # DiT: one block's live set per device.
    rows = batch * (2 if cfg else 1)
    latent_t = (frames - 1) // 4 + 1
    pt, ph, pw = t.patch_size
    length = (latent_t // pt) * (height // 8 // ph) * (width // 8 // pw)
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
    dit_act = (
        tokens * d * (2 * act + 2 * 4)  # residual + normed input, float32 norm / modulation temporaries
        + tokens * heads_local * t.attention_head_dim * act * 2  # q, attention output
        + kv_tokens * heads_local * t.attention_head_dim * act * 2
        + (rows // shards(layout.batch)) * heads_local * ATTENTION_BLOCK[0] * ATTENTION_BLOCK[1] * 4
        + tokens * ffn_local * (act + 4)  # FFN hidden and its float32 GELU
        + 4 * rows * 16 * latent_t * (height // 8) * (width // 8) * 4  # scheduler state (replicated)
    )

    # Text encoder: one layer on 2 * batch prompts.
    te = model.text_encoder
    te_rows = 2 * batch
    te_heads = te.num_heads // tp if te.num_heads % tp == 0 else te.num_heads
    te_ff = te.d_ff // tp if te.d_ff % tp == 0 else te.d_ff
    s = max_sequence_length
    te_act = te_rows * s * (te.d_model * (act + 4) * 2 + te_heads * s * 4 * 2 + 2 * te_ff * (act + 4))

    # VAE decoder, split spatially over all devices: full-resolution layers on one chunk (4 frames:
    # in, out, residual, conv temps), the causal conv's 3-frame input window and its padded copy, and
    # the causal cache carried between chunks (the dominant term: ~1 GiB per device at 720p on 8).
    v = model.vae
    c0 = (v.decoder_base_dim or v.base_dim) * v.dim_mult[0]
    spatial = mesh.num_devices if (height * width) % mesh.num_devices == 0 else 1
    working = (4 * 4 + 2 * 3) * height * width * c0 * vae_act * batch
    vae_act = (working + batch * vae_cache_bytes(v, height, width, vae_dtype)) // spatial

    stages = {
        "encode": StagePlan(e_weights, te_act),
        "denoise": StagePlan(d_weights, dit_act),
        "decode": StagePlan(v_weights, vae_act),
    }
    return Plan(mesh, stages, device_memory, layout)


@functools.lru_cache(maxsize=16)
def vae_cache_bytes(cfg: VAEConfig, height: int, width: int, dtype: str = "float32") -> int:
    """Bytes of the decoder's causal cache for one ``height`` x ``width`` video: the last two input
    frames of every causal conv (3-D convolutions, the accelerator formulation), from the abstract
    first chunk (``jax.eval_shape``: no weights, no compute)."""
    dt = parse_dtype(dtype)
    params = abstract_params(vae.checkpoint_spec(cfg, "decoder"), dt)
    f = cfg.spatial_factor
    z = jax.ShapeDtypeStruct((1, 1, height // f, width // f, cfg.z_dim), dt)
    nm = Numerics(dt, "conv3d")
    _, cache = jax.eval_shape(lambda p, z: decoder_chunk(p, cfg, z, {}, True, nm, 1), params, z)
    return sum(math.prod(a.shape) * np.dtype(a.dtype).itemsize for a in jax.tree.leaves(cache))


def candidate_meshes(num_devices: int, fsdp: bool = False) -> list[MeshSpec]:
    """Every (dp, sp, tp) factorisation of the devices."""
    out = []
    for dp, sp in itertools.product(range(1, num_devices + 1), repeat=2):
        if num_devices % (dp * sp) == 0:
            out.append(MeshSpec((("dp", dp), ("sp", sp), ("tp", num_devices // (dp * sp))), fsdp))
    return out


def parse_memory(text: str) -> int:
    """``32GiB``, ``16G``, ``80`` (GiB) -> bytes."""
    units = {"gib": GiB, "gb": GiB, "g": GiB, "mib": 1 << 20, "mb": 1 << 20, "m": 1 << 20, "": GiB}
    raw = text.strip().lower()
    number = raw.rstrip("abgim")
    unit = raw[len(number) :]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in units or value <= 0:
        raise WanjaxError(f"bad --device_memory {text!r}; write it like 32GiB or 16G")
    return int(value * units[unit])


@dataclasses.dataclass(frozen=True)
class Suggestion:
    """The mesh ``wanjax plan`` suggests, and why (one line, from the plans' numbers)."""

    plan: Plan
    reason: str


def suggest_mesh(plans: list[Plan], heads: int) -> Suggestion | None:
    """Of ``plans`` (one per :func:`candidate_meshes` mesh), the ``--mesh auto`` mesh (what ``generate``
    runs) when it fits, else the fitting mesh with the lowest peak; None when none fits."""
    fitting = [p for p in plans if p.fits]
    if not fitting:
        return None
    leanest = min(fitting, key=lambda p: p.peak)
    preferred = auto_mesh(plans[0].mesh.num_devices, heads, fsdp=plans[0].mesh.fsdp)
    auto = next(p for p in plans if p.mesh.shape == preferred.shape)
    if not auto.fits:
        usable = HEADROOM * auto.device_memory
        return Suggestion(
            leanest,
            f"--mesh auto ({auto.mesh.flag}) would peak at {auto.peak / GiB:.2f} GiB, over the "
            f"{usable / GiB:.1f} GiB usable; this is the fitting mesh with the lowest peak",
        )
    n = auto.block_devices
    devices = "one device" if n == 1 else f"{n} devices that exchange activations"
    reason = f"--mesh auto (generate's default) fits; each DiT block runs on {devices}{auto.roles}"
    if leanest.peak < auto.peak:
        on = "but on" if leanest.block_devices > n else "on the same"
        lower = (auto.peak - leanest.peak) / GiB
        reason += (
            f"; {leanest.mesh.flag} peaks {lower:.2f} GiB lower, {on} {leanest.block_devices} devices"
            f"{leanest.roles}"
        )
    return Suggestion(auto, reason)
