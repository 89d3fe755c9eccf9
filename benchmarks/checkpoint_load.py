"""Checkpoint load time: the ``safe_open`` reader against the hand-written mmap reader it replaced.

A random DiT checkpoint (1.3B dims, ``--layers`` blocks: ~140 M params, 280 MB in bf16) is written
to a temporary directory in bf16 and in float32, then loaded by both readers, alternating, for each
case: one device, and 8 host devices (mesh dp=2 x tp=4, FSDP on) so every leaf is read shard by
shard. Each number is the best of ``--repeats`` loads after an untimed one (warm page cache); the
two readers' params are checked to be bit-identical each time.

    python benchmarks/checkpoint_load.py
    python benchmarks/checkpoint_load.py --baseline <commit>   # the reader of another commit

The baseline reader is ``src/wanjax/io/checkpoint.py`` at ``--baseline``, imported from
``git show``; the spec is rebuilt with its own :class:`LeafSource` (layouts are plain callables).
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

from wanjax.io import checkpoint
from wanjax.models.dit import checkpoint_spec
from wanjax.models.registry import transformer_preset
from wanjax.parallel.rules import param_sharding

BASELINE = "225fa1f"  # the last commit with the hand-written reader
STEM = "diffusion_pytorch_model"


def baseline_module(commit: str, tmp: Path) -> ModuleType:
    """``wanjax.io.checkpoint`` as it was at ``commit``."""
    root = Path(__file__).resolve().parent.parent
    source = subprocess.run(
        ["git", "show", f"{commit}:src/wanjax/io/checkpoint.py"], cwd=root, check=True, capture_output=True
    ).stdout
    path = tmp / "baseline_checkpoint.py"
    path.write_bytes(source)
    spec = importlib.util.spec_from_file_location("baseline_checkpoint", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def convert_spec(spec: Any, module: ModuleType) -> Any:
    """The spec tree with ``module``'s LeafSource."""
    fields = ("names", "shape", "layout", "stacked", "keep_fp32", "axes", "alt_axes")

    def leaf(s: checkpoint.LeafSource) -> Any:
        return module.LeafSource(**{f: getattr(s, f) for f in fields})

    return jax.tree.map(leaf, spec, is_leaf=lambda x: isinstance(x, checkpoint.LeafSource))


def write_checkpoints(spec: Any, tmp: Path) -> dict[str, Path]:
    tensors = checkpoint.random_checkpoint(spec)
    out = {}
    for name, dtype in (("bf16", ml_dtypes.bfloat16), ("f32", np.float32)):
        folder = tmp / name
        folder.mkdir()
        save_file({k: v.astype(dtype) for k, v in tensors.items()}, str(folder / f"{STEM}.safetensors"))
        out[name] = folder
    return out


def load(module: ModuleType, spec: Any, folder: Path, dtype: Any, sharding: Any) -> tuple[float, Any]:
    """``(seconds, params)`` of one load, files opened and every leaf on its devices."""
    start = time.perf_counter()
    refs = module.open_component(folder, [STEM])
    params = jax.block_until_ready(module.load_params(refs, spec, dtype, str(folder), sharding=sharding))
    return time.perf_counter() - start, params


def same_bits(a: Any, b: Any) -> bool:
    pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    return all(np.asarray(x).tobytes() == np.asarray(y).tobytes() for x, y in pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", default=BASELINE, help="commit whose reader to compare against")
    args = parser.parse_args()
    cfg = transformer_preset("1.3B", num_layers=args.layers)
    spec = checkpoint_spec(cfg)
    mesh = jax.make_mesh((2, 4), ("dp", "tp"))
    cases = [
        ("bf16 file -> bf16, 1 device", "bf16", ml_dtypes.bfloat16, None),
        ("f32 file -> bf16, 1 device", "f32", ml_dtypes.bfloat16, None),
        ("f32 file -> f32, 1 device", "f32", np.float32, None),
        ("bf16 file -> bf16, 8 devices FSDP+tp", "bf16", ml_dtypes.bfloat16, param_sharding(mesh, fsdp=True)),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        baseline = baseline_module(args.baseline, Path(tmp))
        readers = {"baseline": (baseline, convert_spec(spec, baseline)), "safe_open": (checkpoint, spec)}
        folders = write_checkpoints(spec, Path(tmp))
        size = (folders["bf16"] / f"{STEM}.safetensors").stat().st_size
        print(f"DiT 1.3B dims, {args.layers} layers: {size / 1e6:.0f} MB in bf16; best of {args.repeats}")
        print(f"{'case':40s} {'baseline':>9s} {'safe_open':>9s} {'ratio':>6s}")
        for label, file, dtype, sharding in cases:
            times: dict[str, list[float]] = {name: [] for name in readers}
            for _ in range(args.repeats + 1):  # the first round warms the page cache, untimed
                params = []
                for name, (module, module_spec) in readers.items():
                    seconds, loaded = load(module, module_spec, folders[file], dtype, sharding)
                    times[name].append(seconds)
                    params.append(loaded)
                assert same_bits(*params), f"{label}: the readers' params differ"
                del params, loaded
            old, new = (min(times[name][1:]) for name in readers)
            print(f"{label:40s} {old:8.2f}s {new:8.2f}s {new / old:6.2f}")


if __name__ == "__main__":
    main()
