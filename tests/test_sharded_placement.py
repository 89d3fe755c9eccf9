"""Leaves can be placed straight onto a sharding: every device gets only its slice, read from disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import jax, numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    import wanjax
    from wanjax.io.checkpoint import LeafSource

    root = sys.argv[1]
    mesh = jax.make_mesh((4,), ("tp",), axis_types=(AxisType.Explicit,))
    reads = []
    original = LeafSource.read

    def counting_read(self, refs, index, dtype):
        out = original(self, refs, index, dtype)
        reads.append((self.names[0], out.size))
        return out

    LeafSource.read = counting_read

    def sharding(source):
        # Column-parallel kernels: split the output axis over tp when it divides.
        shape = source.target_shape()
        if source.names[0].endswith(".weight") and len(shape) >= 2 and shape[-1] % 4 == 0:
            return NamedSharding(mesh, P(*([None] * (len(shape) - 1)), "tp"))
        return NamedSharding(mesh, P())

    sharded = wanjax.load_transformer(root, dtype="float32", sharding=sharding)
    plain = wanjax.load_transformer(root, dtype="float32")
    q = sharded.params["blocks"]["attn1"]["to_q"]["kernel"]
    full = np.asarray(plain.params["blocks"]["attn1"]["to_q"]["kernel"])
    shards = [(s.index, np.asarray(s.data)) for s in q.addressable_shards]
    ok = all(np.array_equal(data, full[index]) for index, data in shards)
    print(json.dumps({
        "spec": str(q.sharding.spec),
        "shard_shapes": sorted({d.shape for _, d in shards}),
        "full_shape": full.shape,
        "values_ok": ok,
        "to_q_reads": [size for name, size in reads if name == "blocks.0.attn1.to_q.weight"],
        "kernel_size": full.size,
    }, default=list))
    """
)


def test_kernels_are_read_per_shard(tiny_transformer_dir):
    root, _ = tiny_transformer_dir
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(root)], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    layers, d_in, d_out = report["full_shape"]
    assert report["spec"] == "P(None, None, 'tp')"
    assert report["shard_shapes"] == [[layers, d_in, d_out // 4]]
    assert report["values_ok"]
    # Each of the 4 devices read its own quarter from the file (plus one whole read for the plain load).
    quarter = report["kernel_size"] // 4
    assert sorted(report["to_q_reads"]) == [quarter] * 4 + [report["kernel_size"]]
