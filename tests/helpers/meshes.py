"""Runs on meshes of the 8 CPU devices (tests/conftest.py) against one device: each returns a report to assert on."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import numpy as np

from wanjax.pipeline import preparation


def write_model(root: Path, heads: int = 12) -> Path:
    """The demo pipeline with a 12-head transformer: 8 devices cannot split its heads evenly."""
    from safetensors.numpy import save_file

    from wanjax.io.checkpoint import random_checkpoint
    from wanjax.models import dit
    from wanjax.models.registry import DEMO_TRANSFORMER
    from wanjax.pipeline.demo import write_demo_model

    write_demo_model(root)
    cfg = dataclasses.replace(
        DEMO_TRANSFORMER, num_attention_heads=heads, attention_head_dim=12, ffn_dim=96, num_layers=2
    )
    folder = root / "transformer"
    tensors = random_checkpoint(dit.checkpoint_spec(cfg), 3)
    save_file(tensors, str(folder / "diffusion_pytorch_model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(cfg.to_dict()))
    return root


GEN = dict(height=32, width=64, num_frames=5, seed=0)


def generate(root: str, mesh: str | None) -> dict[str, np.ndarray]:
    from wanjax import WanPipeline

    pipe = WanPipeline.from_pretrained(root, dtype="float32", jax_cache_dir=False, mesh=mesh)
    pos, neg = pipe.encode_prompt("a red cat walks", None, max_sequence_length=16)
    noise = pipe.prepare_latents(1, **GEN)
    latents = pipe.denoise(pos, neg, noise, num_inference_steps=2, guidance_scale=5.0, progress=False).latents
    frames = pipe.decode(latents)
    from wanjax.parallel.layouts import to_host

    return {"embeds": to_host(pos), "latents": to_host(latents), "frames": frames}


def parity(root: str, meshes: list[str]) -> dict:
    from wanjax.parallel.attention import sequence_mode
    from wanjax.parallel.layouts import token_layout
    from wanjax.parallel.mesh import parse_mesh

    ref = generate(root, None)
    out = {}
    for mesh in meshes:
        got = generate(root, mesh)
        sizes = parse_mesh(mesh).sizes
        layout = token_layout(sizes, 2, 2 * 2 * 4, 12)  # CFG batch 2, 16 tokens, 12 heads
        out[mesh] = {
            "mode": sequence_mode(layout, sizes, 12),
            "layout": dataclasses.asdict(layout),
            "latents_rel": float(
                np.linalg.norm(got["latents"] - ref["latents"]) / np.linalg.norm(ref["latents"])
            ),
            "embeds_max": float(np.abs(got["embeds"] - ref["embeds"]).max()),
            "frames_max": int(np.abs(got["frames"].astype(int) - ref["frames"]).max()),
            "frames_shape": list(got["frames"].shape),
        }
    return out


def demo_parity(root: str, variant: str, meshes: list[str], strength: float | None = None) -> dict:
    """Demo model ``variant`` (``demo-i2v``, ``demo-a14b``, ``demo-ti2v``: written into ``root``) on each of
    ``meshes`` vs one device, float32: the image's conditioning (image to video; with ``strength``,
    video to video: the source video's latents), the final latents (two experts: the steps each ran)
    and the frames."""
    from wanjax import WanPipeline
    from wanjax.parallel.layouts import to_host
    from wanjax.pipeline.demo import write_demo_model

    write_demo_model(root, variant)
    image = np.random.default_rng(0).integers(0, 256, (40, 72, 3), dtype=np.uint8)

    def run(mesh: str | None) -> dict[str, np.ndarray]:
        pipe = WanPipeline.from_pretrained(root, dtype="float32", jax_cache_dir=False, mesh=mesh)
        pos, neg = pipe.encode_prompt("a red cat walks", None, max_sequence_length=16)
        conditioning, found = None, {}
        if pipe.components.transformer_config.image_to_video or pipe.components.expand_timesteps:
            conditioning = preparation.image_conditioning(
                pipe.components, image, 1, GEN["height"], GEN["width"], GEN["num_frames"]
            )
            found = {"condition": to_host(conditioning.latents)}
            if conditioning.image_embeds is not None:
                found["states"] = to_host(conditioning.image_embeds)
        source = None
        if strength is not None:
            frames = [np.roll(image, 3 * t, axis=1) for t in range(GEN["num_frames"])]
            source = preparation.video_latents(pipe.components, frames, GEN["height"], GEN["width"])
            found = {"condition": to_host(source)}
        noise = pipe.prepare_latents(1, **GEN)
        denoised = pipe.denoise(
            pos,
            neg,
            noise,
            num_inference_steps=4,
            progress=False,
            image=conditioning,
            video_latents=source,
            strength=strength,
        )
        return {
            **found,
            "latents": to_host(denoised.latents),
            "frames": pipe.decode(denoised.latents),
            "experts": list(denoised.expert_steps),
        }

    ref = run(None)
    out = {}
    for mesh in meshes:
        got = run(mesh)
        out[mesh] = {
            **{
                f"{name}_max": float(np.abs(got[name] - ref[name]).max())
                for name in ("condition", "states")
                if name in ref
            },
            "experts": [got["experts"], ref["experts"]],
            "latents_rel": float(
                np.linalg.norm(got["latents"] - ref["latents"]) / np.linalg.norm(ref["latents"])
            ),
            "frames_max": int(np.abs(got["frames"].astype(int) - ref["frames"]).max()),
        }
    return out


def vae_strips(root: str, cases: list[str]) -> dict:
    """The demo VAE's decode of small latents ``HxW`` split over mesh ``M`` (``HxW@M`` cases, or
    ``HxW@M@CONV`` with a convolution formulation) vs one device: the largest uint8 difference and
    the split used."""
    from wanjax.models.vae import load_vae
    from wanjax.parallel.layouts import spatial_sharding, to_global, to_host
    from wanjax.parallel.mesh import make_mesh, parse_mesh
    from wanjax.parallel.rules import replicated
    from wanjax.pipeline.demo import write_demo_model

    write_demo_model(root)
    out = {}
    for case in cases:
        size, text, *conv = case.split("@")
        conv = {"conv": conv[0]} if conv else {}
        base = load_vae(root, "float32", **conv)
        z = (
            np.random.default_rng(0)
            .standard_normal((1, 16, 2, *map(int, size.split("x"))))
            .astype(np.float32)
        )
        spec = parse_mesh(text)
        mesh = make_mesh(spec, jax.devices()[: spec.num_devices])
        vae = load_vae(root, "float32", sharding=lambda source, mesh=mesh: replicated(mesh), **conv)
        x = to_global(z, spatial_sharding(mesh, z.shape))
        frames = to_host(vae.decode_uint8(x))
        ref = np.asarray(base.decode_uint8(z))
        out[case] = {"max": int(np.abs(frames.astype(int) - ref).max()), "spec": str(x.sharding.spec)}
    return out


def params(root: str, meshes: list[str]) -> dict:
    from wanjax.models.dit import load_transformer
    from wanjax.models.umt5 import load_text_encoder
    from wanjax.parallel.mesh import make_mesh, parse_mesh
    from wanjax.parallel.rules import param_sharding, sharded_bytes

    out = {}
    for text in meshes:
        mesh = make_mesh(parse_mesh(text))
        model = load_transformer(root, "float32", mesh=mesh)
        encoder = load_text_encoder(root, "float32", sharding=param_sharding(mesh))
        leaves = {}
        for name, tree in (("dit", model.params), ("umt5", encoder.params)):
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
                key = name + "/" + "/".join(str(k.key) for k in path)
                shard_shapes = {tuple(s.data.shape) for s in leaf.addressable_shards}
                leaves[key] = {
                    "shape": list(leaf.shape),
                    "spec": str(leaf.sharding.spec),
                    "shard_shape": list(max(shard_shapes)),
                    "uniform": len(shard_shapes) == 1,
                }
        per_device = sharded_bytes(model.params)
        out[text] = {"leaves": leaves, "max_device_bytes": max(per_device.values())}
    return out


def vae_memory(root: str, counts: list[int]) -> dict:
    """Per-device temporary bytes of the decode program with the latents split over n devices."""
    from wanjax.models.vae import load_vae
    from wanjax.parallel.layouts import spatial_sharding, to_global
    from wanjax.parallel.mesh import make_mesh, parse_mesh
    from wanjax.parallel.rules import replicated

    z = np.random.default_rng(0).standard_normal((1, 16, 2, 16, 32)).astype(np.float32)
    out = {}
    for n in counts:
        mesh = make_mesh(parse_mesh(f"sp={n}"), jax.devices()[:n])
        vae = load_vae(root, "float32", sharding=lambda source, mesh=mesh: replicated(mesh))
        x = to_global(z, spatial_sharding(mesh, z.shape))
        memory = vae.compile("decode_uint8", x).memory_analysis()
        out[n] = {"temp": memory.temp_size_in_bytes, "spec": str(x.sharding.spec)}
    return out
