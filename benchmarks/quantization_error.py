"""How far 8-bit weights (``--weights_dtype int8|fp8``) move the models' outputs from bf16 weights.

    python benchmarks/quantization_error.py                    # tiny parity DiT, 1.3B dims (4 layers), UMT5
    python benchmarks/quantization_error.py --layers 30        # the whole 1.3B depth (~6 GB RAM, minutes)
    python benchmarks/quantization_error.py --only frames      # the demo pipeline's frames: PSNR vs bf16

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
from wanjax.kernels.common import Platform
from wanjax.models import dit, umt5
from wanjax.models.registry import UMT5_XXL, transformer_preset
from wanjax.models.settings import RunSettings

VARIANTS = ("float32", "bf16", "int8", "fp8", "fp8 native")


def relative_error(a: Any, b: Any) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def variant(name: str) -> tuple[Any, str]:
    """``(model dtype, --weights_dtype)`` of a variant."""
    return (jnp.float32, "bf16") if name == "float32" else (jnp.bfloat16, name.split()[0])


class native_fp8_platform:
    """Within: the layers see an H100 (fp8 matmuls in fp8); outside, this process's platform."""

    def __init__(self, on: bool):
        self.on = on

    def __enter__(self) -> None:
        self.saved = layers._this_platform
        if self.on:
            layers._this_platform = lambda: (Platform("gpu", (9, 0)), "")

    def __exit__(self, *exc: object) -> None:
        layers._this_platform = self.saved


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
        return dit.load_transformer(folder, dtype, weights_dtype=weights)(*inputs)

    report("tiny DiT (parity model), velocity", errors(run))


def dims_1_3b(num_layers: int) -> None:
    cfg = transformer_preset("1.3B", num_layers=num_layers)
    spec = dit.checkpoint_spec(cfg)
    inputs = dit_inputs(cfg, (1, 16, 5, 30, 52), 512)

    def run(name: str) -> jax.Array:
        dtype, weights = variant(name)
        params = random_params(spec, dtype, build=leaf_builder(weights))
        out = dit.WanTransformer(cfg, params, RunSettings(dtype))(*inputs)
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
        pipe = WanPipeline.from_pretrained("demo", dtype, weights_dtype=weights)
        with native_fp8_platform(name == "fp8 native"):  # the demo's default size and steps
            videos[name] = pipe("a red fox in the snow", seed=0).frames
    print(
        f"{'demo pipeline, frames PSNR (dB)':<34}"
        + "".join(f"{psnr(videos[v], videos['bf16']):>12.1f}" for v in VARIANTS if v != "bf16"),
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=4, help="blocks of the 1.3B DiT (of 30)")
    parser.add_argument("--umt5_layers", type=int, default=2, help="blocks of the UMT5-XXL encoder (of 24)")
    parser.add_argument("--only", choices=("tiny", "1.3B", "umt5", "frames"), action="append")
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


if __name__ == "__main__":
    main()
