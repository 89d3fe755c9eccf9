"""A transformer file's load: peak host memory and time, GGUF (Q8_0, Q4_0; dequantised, or kept as
their blocks with ``--weights_dtype gguf``) against bf16 safetensors.

A real variant's transformer with ``--layers`` of its blocks (random weights, the original Wan key
names, as city96's GGUF files and ComfyUI's single files hold them; GGUF: the 2-D matmul kernels
quantised, the rest float32, as city96's convert.py writes them) is written to a temporary folder,
then each file is loaded by ``load_transformer(file, "bfloat16", config=...)`` in its own process:
its peak resident memory during the load (``VmHWM`` after resetting it through
``/proc/self/clear_refs``; it counts the file's pages the reader maps, which the system can drop)
and the peak of its anonymous memory (``RssAnon``, sampled every 5 ms: what cannot be dropped), each
over what the process held before, against the
file's size and the loaded weights' bytes (one device; ``--weights_dtype bf16``: GGUF tensors are
dequantised as they are read; ``gguf``: the quantised kernels stay the file's blocks).

    python benchmarks/gguf_load_memory.py                      # 14B, 2 of its 40 blocks
    python benchmarks/gguf_load_memory.py --arch 1.3B --layers 4
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

GiB = 1 << 30


def write_files(arch: str, layers: int, folder: Path) -> dict[str, Path]:
    """The transformer as bf16 safetensors and as GGUF Q8_0 and Q4_0 files (original key names)."""
    import gguf
    import ml_dtypes
    import numpy as np
    from safetensors.numpy import save_file

    from wanjax.io.key_layouts import rename_spec, spec_names
    from wanjax.models.dit import checkpoint_spec
    from wanjax.models.dit_layouts import WAN_TRANSFORMER
    from wanjax.models.registry import transformer_preset

    names = spec_names(
        rename_spec(checkpoint_spec(transformer_preset(arch, num_layers=layers)), WAN_TRANSFORMER)
    )
    rng = np.random.default_rng(0)
    values = {n: (rng.standard_normal(s, np.float32) * 0.02) for n, s in names.items()}
    files = {"safetensors bf16": folder / "wan.safetensors"}
    save_file({n: v.astype(ml_dtypes.bfloat16) for n, v in values.items()}, files["safetensors bf16"])
    for qtype in (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0):
        path = folder / f"wan-{qtype.name}.gguf"
        writer = gguf.GGUFWriter(path, arch="wan")
        for n, v in values.items():
            if v.ndim == 2 and v.shape[-1] % 32 == 0:
                writer.add_tensor(n, gguf.quants.quantize(v, qtype), raw_dtype=qtype)
            else:
                writer.add_tensor(n, v)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        files[f"GGUF {qtype.name}"] = path
    return files


def load_once(arch: str, layers: int, path: str, weights_dtype: str) -> dict[str, float]:
    """In this process: load ``path`` and report the peak resident memory the load added."""
    import jax

    from wanjax.models.dit import load_transformer
    from wanjax.models.registry import transformer_preset

    config = transformer_preset(arch, num_layers=layers)
    jax.devices()
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from now
    before, anon_before = _status_bytes("VmRSS"), _status_bytes("RssAnon")
    anon_peak, done = [anon_before], threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            anon_peak.append(max(anon_peak[-1], _status_bytes("RssAnon")))

    sampler = threading.Thread(target=sample)
    sampler.start()
    start = time.perf_counter()
    model = load_transformer(path, "bfloat16", config=config, weights_dtype=weights_dtype)
    jax.block_until_ready(model.params)
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    peak = _status_bytes("VmHWM")
    weights = sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(model.params))
    anon = max(anon_peak[-1], _status_bytes("RssAnon")) - anon_before
    return {
        "seconds": seconds,
        "peak_added_bytes": peak - before,
        "anon_added_bytes": anon,
        "weights_bytes": weights,
    }


def _status_bytes(field: str) -> int:
    """A memory line of ``/proc/self/status`` (kB) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--arch", default="14B")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child_weights", default="bf16", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(load_once(args.arch, args.layers, args.child, args.child_weights)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        files = write_files(args.arch, args.layers, Path(tmp))
        print(f"{args.arch}, {args.layers} blocks, one CPU device, loaded as bfloat16")
        print(
            "| file | file GiB | loaded weights GiB | peak resident added, GiB | peak anonymous added, GiB | load s |"
        )
        print("|---|---|---|---|---|---|")
        runs = [(name, path, "bf16") for name, path in files.items()]
        runs += [(f"{name} kept", path, "gguf") for name, path in files.items() if name.startswith("GGUF")]
        for name, path, weights in runs:
            command = [sys.executable, __file__, "--arch", args.arch, "--layers", str(args.layers)]
            command += ["--child", str(path), "--child_weights", weights]
            out = subprocess.run(command, capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(
                f"| {name} | {path.stat().st_size / GiB:.2f} | {r['weights_bytes'] / GiB:.2f} | "
                f"{r['peak_added_bytes'] / GiB:.2f} | {r['anon_added_bytes'] / GiB:.2f} | {r['seconds']:.1f} |"
            )


if __name__ == "__main__":
    main()
