"""How far 8-bit weights (``--weights_dtype int8|fp8``) move the models' outputs from bf16 weights.

    python benchmarks/quantization_error.py                    # tiny parity DiT, 1.3B dims (4 layers), UMT5
    python benchmarks/quantization_error.py --layers 30        # the whole 1.3B depth (~6 GB RAM, minutes)
    python benchmarks/quantization_error.py --only frames      # the demo pipeline's frames: PSNR vs bf16
    python benchmarks/quantization_error.py --only lora        # a LoRA merged into 8-bit weights: frames

Each model runs in bf16 activations with bf16 weights (the reference), then with its matmul kernels
quantised (the same weights: one seed, quantised as they are read); a float32 run shows how far bf16
rounding alone moves the output. ``fp8 native`` simulates a platform that multiplies e4m3 natively
(an H100: activations rounded to e4m3 per token too); elsewhere fp8 is weight-only.

* ``tiny``: the parity tests' tiny DiT (``tests/helpers/models.py``'s ``TINY_DIT``: diffusers ``WanTransformer3DModel``,
  weights ~N(0, 0.3²)), saved with ``save_pretrained`` and read through ``load_transformer``.
* ``1.3B``: Wan 1.3B dimensions (``--layers`` of its 30 blocks), :func:`random_params` weights,
  latents [1, 16, 5, 30, 52] (1,950 tokens) and 512 text tokens, timestep 500.
* ``umt5``: UMT5-XXL dimensions (``--umt5_layers`` blocks, a 1,000-token vocabulary), 64 tokens. A
  random T5 amplifies any perturbation (bf16 rounding alone moves it by several percent), so read
  its rows against the float32 row.
* ``frames``: the demo model through the pipeline (10 steps, 17 frames at 128x192; random weights,
  its videos are noise), frames' PSNR vs the bf16 run.

The velocity error is ``||v - v_bf16|| / ||v_bf16||``.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import wanjax.models.layers as layers
from wanjax.io.checkpoint import random_params
from wanjax.io.quant import leaf_builder
from wanjax.models import dit, umt5
from wanjax.models.registry import UMT5_XXL, transformer_preset
from wanjax.models.settings import RunSettings

VARIANTS = ("float32", "bf16", "int8", "int8 W8A8", "fp8", "fp8 native")


def relative_error(a: Any, b: Any) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def variant(name: str) -> tuple[Any, str]:
    """``(model dtype, --weights_dtype)`` of a variant."""
    return (jnp.float32, "bf16") if name == "float32" else (jnp.bfloat16, name.split()[0])


def activations(name: str) -> str:
    """``--activations_dtype`` of a variant: ``int8 W8A8`` multiplies the DiT blocks' matmuls in int8
    (the text encoder stays weight-only: its row equals int8's), the others weight-only."""
    return "int8" if name == "int8 W8A8" else "bfloat16"


class native_fp8_platform:
    """Within: the layers see an H100 (fp8 matmuls in fp8); outside, this process's platform."""

    def __init__(self, on: bool):
        self.on = on

    def __enter__(self) -> None:
        self.saved = layers.native_fp8
        if self.on:
            layers.native_fp8 = lambda platform=None, device_kind=None: True

    def __exit__(self, *exc: object) -> None:
        layers.native_fp8 = self.saved


def errors(run: Callable[[str], Any]) -> dict[str, float]:
    """Each variant's relative error vs ``bf16``, from ``run(variant) -> output``."""
    outputs = {}
    for name in VARIANTS:
        with native_fp8_platform(name == "fp8 native"):
            outputs[name] = np.asarray(run(name), np.float32)
    return {name: relative_error(out, outputs["bf16"]) for name, out in outputs.items() if name != "bf16"}


def report(label: str, errs: dict[str, float]) -> None:
    print(f"{label:<34}" + "".join(f"{errs[v]:>12.2e}" for v in VARIANTS if v != "bf16"), flush=True)


def dit_inputs(cfg: Any, shape: tuple[int, ...], text: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    rng = np.random.default_rng(1)
    latents = jnp.asarray(rng.standard_normal(shape, dtype=np.float32))
    embeds = jnp.asarray(rng.standard_normal((1, text, cfg.text_dim), dtype=np.float32))
    return latents, jnp.asarray([500.0]), embeds


def tiny(folder: Path) -> None:
    import torch
    from diffusers import WanTransformer3DModel

    cfg = transformer_preset("tiny")
    accepted = inspect.signature(WanTransformer3DModel.__init__).parameters
    model = WanTransformer3DModel(
        **{k: v for k, v in dataclasses.asdict(cfg).items() if k in accepted}
    ).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    model.save_pretrained(folder / "transformer")
    inputs = dit_inputs(cfg, (1, 16, 3, 16, 16), 8)

    def run(name: str) -> jax.Array:
        dtype, weights = variant(name)
        return dit.load_transformer(
            folder, dtype, weights_dtype=weights, activations_dtype=activations(name)
        )(*inputs)

    report("tiny DiT (parity model), velocity", errors(run))


def dims_1_3b(num_layers: int) -> None:
    cfg = transformer_preset("1.3B", num_layers=num_layers)
    spec = dit.checkpoint_spec(cfg)
    inputs = dit_inputs(cfg, (1, 16, 5, 30, 52), 512)

    def run(name: str) -> jax.Array:
        dtype, weights = variant(name)
        params = random_params(spec, dtype, build=leaf_builder(weights))
        settings = RunSettings(dtype, int8_matmuls=activations(name) == "int8")
        out = dit.WanTransformer(cfg, params, settings)(*inputs)
        return jax.block_until_ready(out)

    report(f"1.3B dims, {num_layers} layers, velocity", errors(run))


def umt5_xxl(num_layers: int) -> None:
    cfg = dataclasses.replace(UMT5_XXL, vocab_size=1000, num_layers=num_layers)
    spec = umt5.checkpoint_spec(cfg)
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 1000, (1, 64)), jnp.int32)
    mask = jnp.ones((1, 64), jnp.int32)

    def run(name: str) -> jax.Array:
        dtype, weights = variant(name)
        params = random_params(spec, dtype, build=leaf_builder(weights))
        return jax.jit(lambda p: umt5.forward(p, cfg, ids, mask))(params)

    report(f"UMT5-XXL dims, {num_layers} layers, hidden", errors(run))


def frames() -> None:
    """The demo pipeline, its transformer and text encoder loaded with 8-bit weights."""
    from wanjax.pipeline.pipeline import WanPipeline

    videos = {}
    for name in VARIANTS:
        dtype, weights = variant(name)
        pipe = WanPipeline.from_pretrained(
            "demo", dtype, weights_dtype=weights, activations_dtype=activations(name)
        )
        with native_fp8_platform(name == "fp8 native"):  # the demo's default size and steps
            videos[name] = pipe("a red fox in the snow", seed=0).frames
    print(
        f"{'demo pipeline, frames PSNR (dB)':<34}"
        + "".join(f"{psnr(videos[v], videos['bf16']):>12.1f}" for v in VARIANTS if v != "bf16"),
        flush=True,
    )


def demo_lora(folder: Path, relative: float = 0.2, rank: int = 8) -> Path:
    """A random LoRA (original Wan names) over every block projection of the demo transformer, each
    update about ``relative`` of its weight's norm."""
    from safetensors.numpy import load_file, save_file

    from wanjax.models.dit_layouts import WAN_TRANSFORMER
    from wanjax.pipeline.hub import resolve_model

    state = load_file(resolve_model("demo").path / "transformer" / "diffusion_pytorch_model.safetensors")
    rng = np.random.default_rng(0)
    lora = {}
    for name, w in state.items():
        if name.startswith("blocks.") and name.endswith(".weight") and w.ndim == 2:
            down = rng.standard_normal((rank, w.shape[1])).astype(np.float32)
            up = rng.standard_normal((w.shape[0], rank)).astype(np.float32)
            up *= relative * np.linalg.norm(w) / np.linalg.norm(up @ down)
            module = "diffusion_model." + WAN_TRANSFORMER.file_name(name).removesuffix(".weight")
            lora[f"{module}.lora_down.weight"], lora[f"{module}.lora_up.weight"] = down, up
    save_file(lora, folder / "lora.safetensors")
    return folder / "lora.safetensors"


def fp8_scaled_demo(folder: Path) -> Path:
    """The demo transformer as an fp8-scaled single file (ComfyUI's convention: per-tensor scales)."""
    import ml_dtypes
    from safetensors.numpy import load_file, save_file

    from wanjax.models.dit_layouts import WAN_TRANSFORMER
    from wanjax.pipeline.hub import resolve_model

    state = load_file(resolve_model("demo").path / "transformer" / "diffusion_pytorch_model.safetensors")
    out = {"scaled_fp8": np.zeros(0, ml_dtypes.float8_e4m3fn)}
    for name, w in state.items():
        name = WAN_TRANSFORMER.file_name(name)
        if w.ndim == 2 and name.endswith(".weight"):
            scale = np.array(np.abs(w).max() / 448, np.float32)
            out[name] = (w / scale).astype(ml_dtypes.float8_e4m3fn)
            out[name.removesuffix("weight") + "scale_weight"] = scale
        else:
            out[name] = w
    save_file(out, folder / "demo_fp8_scaled.safetensors")
    return folder / "demo_fp8_scaled.safetensors"


def lora_frames(folder: Path) -> None:
    """The demo pipeline with a LoRA merged into 8-bit weights: frames' PSNR and largest difference
    (uint8 levels) against the same LoRA merged into bf16 weights; and an fp8-scaled file's."""
    from wanjax.pipeline.pipeline import WanPipeline

    lora = [(demo_lora(folder), 1.0)]
    fp8_file = fp8_scaled_demo(folder)
    runs = {
        "bf16 + LoRA": {},
        "int8 + LoRA": {"weights_dtype": "int8"},
        "fp8 + LoRA": {"weights_dtype": "fp8"},
        "fp8-scaled file, bf16 + LoRA": {"transformer": fp8_file},
        "fp8-scaled file, fp8 + LoRA": {"transformer": fp8_file, "weights_dtype": "fp8"},
    }
    videos = {}
    for name, options in runs.items():
        pipe = WanPipeline.from_pretrained("demo", "bfloat16", loras=lora, **options)
        videos[name] = pipe("a red fox in the snow", seed=0).frames
    for name, reference in (
        ("int8 + LoRA", "bf16 + LoRA"),
        ("fp8 + LoRA", "bf16 + LoRA"),
        ("fp8-scaled file, fp8 + LoRA", "fp8-scaled file, bf16 + LoRA"),
    ):
        diff = np.abs(videos[name].astype(np.int16) - videos[reference]).max()
        print(
            f"{name + ' vs ' + reference:<62} PSNR {psnr(videos[name], videos[reference]):6.1f} dB, max {diff} levels"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=4, help="blocks of the 1.3B DiT (of 30)")
    parser.add_argument("--umt5_layers", type=int, default=2, help="blocks of the UMT5-XXL encoder (of 24)")
    parser.add_argument("--only", choices=("tiny", "1.3B", "umt5", "frames", "lora"), action="append")
    args = parser.parse_args()
    only = set(args.only or ("tiny", "1.3B", "umt5"))
    print(
        f"error vs bf16 ({jax.default_backend()})".ljust(34)
        + "".join(f"{v:>12}" for v in VARIANTS if v != "bf16")
    )
    if "tiny" in only:
        with tempfile.TemporaryDirectory() as folder:
            tiny(Path(folder))
    if "1.3B" in only:
        dims_1_3b(args.layers)
    if "umt5" in only:
        umt5_xxl(args.umt5_layers)
    if "frames" in only:
        frames()
    if "lora" in only:
        with tempfile.TemporaryDirectory() as folder:
            lora_frames(Path(folder))


if __name__ == "__main__":
    main()
