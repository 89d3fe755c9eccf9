"""UMT5 encoder, wanjax vs transformers, side by side on the same weights and token ids.

umt5-xxl dimensions (d_model 4096, 64 heads x 64, d_ff 10240) with few layers and the vocabulary
cut to save memory; one prompt of 512 tokens. The two implementations alternate within each repeat;
wanjax's compile (first call) is timed apart from steady calls. A second line times what the
pipeline does for a short prompt (``--prompt_tokens`` real tokens padded to 512): transformers runs
all 512 positions, wanjax (``trim_padding``) the shortest power of two that holds the prompt.

    python benchmarks/umt5_vs_transformers.py --layers 2 --repeats 5 --dtypes float32 bfloat16
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import torch
from transformers import UMT5Config, UMT5EncoderModel

from wanjax.models.registry import UMT5_XXL
from wanjax.models.umt5 import UMT5Encoder, load_encoder_params
from wanjax.tools.measure import timed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--prompt_tokens", type=int, default=100, help="0 skips the short-prompt line")
    args = parser.parse_args()

    torch.manual_seed(0)
    xxl = UMT5_XXL
    config = UMT5Config(
        vocab_size=args.vocab,
        d_model=xxl.d_model,
        d_kv=xxl.d_kv,
        num_heads=xxl.num_heads,
        d_ff=xxl.d_ff,
        num_layers=args.layers,
    )
    ref = UMT5EncoderModel(config).eval()  # transformers' own (T5) initialisation
    rng = np.random.default_rng(0)
    ids = rng.integers(3, args.vocab, (1, args.length))
    ids[0, -1] = 1
    full_mask = np.ones_like(ids)
    short_ids, short_mask = ids.copy(), np.zeros_like(ids)
    short_ids[0, args.prompt_tokens :] = 0
    short_mask[0, : args.prompt_tokens] = 1

    print(
        f"machine: {jax.devices()[0].device_kind}, torch threads {torch.get_num_threads()}, "
        f"jax {jax.__version__}, torch {torch.__version__}"
    )
    print(f"umt5-xxl dims, {args.layers} layers, vocab {args.vocab}, 1 x {args.length} tokens")
    with tempfile.TemporaryDirectory() as tmp:
        ref.save_pretrained(Path(tmp) / "text_encoder")
        del ref
        for dtype in args.dtypes:
            compare(Path(tmp), dtype, ids, full_mask, args.repeats, f"{args.length} tokens")
            if args.prompt_tokens:
                label = f"{args.prompt_tokens}-token prompt padded to {args.length}"
                compare(Path(tmp), dtype, short_ids, short_mask, args.repeats, label)


def compare(model_dir: Path, dtype: str, ids: np.ndarray, mask: np.ndarray, repeats: int, label: str) -> None:
    """Alternate transformers and wanjax on the same weights; print medians and the ratio."""
    tdtype = getattr(torch, dtype)
    start = time.perf_counter()
    ref_model = UMT5EncoderModel.from_pretrained(model_dir / "text_encoder", dtype=tdtype).eval()
    ref_load = time.perf_counter() - start
    start = time.perf_counter()
    cfg, params = jax.block_until_ready(load_encoder_params(model_dir, dtype))
    ours_load = time.perf_counter() - start
    ours = UMT5Encoder(cfg, params, tokenizer=None)
    t_ids, t_mask = torch.from_numpy(ids), torch.from_numpy(mask)
    keep = torch.from_numpy(mask)[..., None].bool()

    def run_ref():
        with torch.no_grad():  # what WanPipeline.encode_prompt does around the model
            return ref_model(t_ids, t_mask).last_hidden_state.masked_fill(~keep, 0)

    def run_ours():
        return ours.encode_ids(ids, mask).block_until_ready()

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
        f"{dtype:9s} {label}: transformers median {med_ref:.3f}s (min {min(t_ref):.3f}, first {ref_first:.2f}) | "
        f"wanjax median {med_ours:.3f}s (min {min(t_ours):.3f}, compile+first {compile_s:.2f}) | "
        f"ratio wanjax/transformers {med_ours / med_ref:.2f} (min-based {min(t_ours) / min(t_ref):.2f}) | "
        f"rel diff {rel:.1e} | load: transformers {ref_load:.1f}s, wanjax {ours_load:.1f}s"
    )


if __name__ == "__main__":
    main()
