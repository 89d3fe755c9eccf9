"""DiT forward, wanjax vs diffusers, side by side on the same weights and inputs.

1.3B dimensions with few layers, latent [1,16,5,30,52] (L = 1,950 tokens), 512 text tokens. The two
implementations alternate within each repeat; compile (first call) is timed apart from steady calls.

    python benchmarks/dit_vs_diffusers.py --layers 2 --repeats 5 --dtypes float32 bfloat16
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import torch
from diffusers import WanTransformer3DModel

import wanjax
from wanjax.models.registry import transformer_preset
from wanjax.tools.measure import timed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--latent", type=int, nargs=5, default=[1, 16, 5, 30, 52])
    parser.add_argument("--text_len", type=int, default=512)
    args = parser.parse_args()
    torch.set_num_threads(torch.get_num_threads())

    torch.manual_seed(0)
    ref = WanTransformer3DModel(**transformer_preset("1.3B", num_layers=args.layers).to_dict()).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.02)
    latents = torch.randn(args.latent)
    timestep = torch.tensor([500] * args.latent[0])
    text = torch.randn(args.latent[0], args.text_len, 4096)

    print(
        f"machine: {jax.devices()[0].device_kind}, torch threads {torch.get_num_threads()}, "
        f"jax {jax.__version__}, torch {torch.__version__}"
    )
    print(f"DiT 1.3B dims, {args.layers} layers, latent {args.latent}, text {args.text_len} tokens")
    with tempfile.TemporaryDirectory() as tmp:
        ref.save_pretrained(Path(tmp) / "transformer")
        for dtype in args.dtypes:
            compare(Path(tmp), dtype, latents, timestep, text, args.repeats)


def compare(
    model_dir: Path,
    dtype: str,
    latents: torch.Tensor,
    timestep: torch.Tensor,
    text: torch.Tensor,
    repeats: int,
) -> None:
    """Alternate diffusers and wanjax forwards on the same weights; print medians and the ratio."""
    tdtype = getattr(torch, dtype)
    ref_model = WanTransformer3DModel.from_pretrained(model_dir / "transformer", torch_dtype=tdtype)
    ours = wanjax.load_transformer(model_dir, dtype=dtype)
    t_in = (latents.to(tdtype), timestep, text.to(tdtype))
    j_in = (jnp.asarray(latents.numpy()), jnp.asarray(timestep.numpy()), jnp.asarray(text.numpy()))

    def run_ref():
        with torch.no_grad():
            return ref_model(*t_in).sample

    def run_ours():
        return ours(*j_in).block_until_ready()

    compile_s = timed(run_ours)
    ref_first = timed(run_ref)
    t_ref, t_ours = [], []
    for _ in range(repeats):
        t_ref.append(timed(run_ref))
        t_ours.append(timed(run_ours))
    out_ref = run_ref().float().numpy()
    out = np.asarray(run_ours().astype(jnp.float32))
    rel = np.linalg.norm(out - out_ref) / np.linalg.norm(out_ref)
    med_ref, med_ours = statistics.median(t_ref), statistics.median(t_ours)
    print(
        f"{dtype:9s} diffusers median {med_ref:.3f}s (min {min(t_ref):.3f}, first {ref_first:.2f}) | "
        f"wanjax median {med_ours:.3f}s (min {min(t_ours):.3f}, compile+first {compile_s:.2f}) | "
        f"ratio wanjax/diffusers {med_ours / med_ref:.2f} (min-based {min(t_ours) / min(t_ref):.2f}) | "
        f"rel diff {rel:.1e}"
    )


if __name__ == "__main__":
    main()
