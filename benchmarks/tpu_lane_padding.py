"""How many bytes a TPU gives an array, against its shape: the evidence for ``Target.lanes``
(``wanjax plan`` pads feature maps' channels to it on a TPU target).

Each shape (the Wan 2.1 VAE decoder's 720p feature maps on one of 8 strips: 96, 128, 192 and 3
channels) is the output of an elementwise program compiled by the real TPU compiler (libtpu; no TPU
needed) for one chip of the slice; its ``memory_analysis()`` output bytes are printed beside the
shape's own.

    python benchmarks/tpu_lane_padding.py --slice v5e-8
"""

from __future__ import annotations

import argparse
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from wanjax.chips import SLICES
from wanjax.tools.compile_target import slice_target

SHAPES = ((1, 3, 90, 160, 96), (1, 3, 90, 160, 128), (1, 3, 90, 160, 192), (1, 3, 90, 160, 3))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--slice", default="v5e-8", choices=sorted(SLICES))
    args = parser.parse_args()
    device = slice_target(SLICES[args.slice]).devices[0]
    sharding = NamedSharding(Mesh(np.array([device]), ("x",)), PartitionSpec())
    print(f"{args.slice}, one chip, float32 | shape | bytes | bytes on the TPU | ratio")
    for shape in SHAPES:
        x = jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding)
        compiled = jax.jit(lambda a: a * 2 + 1).lower(x).compile()
        own, tpu = math.prod(shape) * 4, compiled.memory_analysis().output_size_in_bytes
        print(f"| {shape} | {own:,} | {tpu:,} | {tpu / own:.3f} |")


if __name__ == "__main__":
    main()
