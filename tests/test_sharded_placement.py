"""Leaves can be placed straight onto a sharding: every device gets only its slice, read from disk."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import wanjax
from wanjax.io.checkpoint import LeafSource


def test_kernels_are_read_per_shard(tiny_transformer_dir, monkeypatch):
    root, _ = tiny_transformer_dir
    mesh = jax.make_mesh((4,), ("tp",), axis_types=(AxisType.Explicit,), devices=jax.devices()[:4])
    reads = []
    original = LeafSource.read

    def counting_read(self, refs, index, dtype):
        out = original(self, refs, index, dtype)
        reads.append((self.names[0], out.size))
        return out

    monkeypatch.setattr(LeafSource, "read", counting_read)

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
    layers, d_in, d_out = full.shape
    assert str(q.sharding.spec) == "P(None, None, 'tp')"
    assert {data.shape for _, data in shards} == {(layers, d_in, d_out // 4)}
    assert all(np.array_equal(data, full[index]) for index, data in shards)
    # Each of the 4 devices read its own quarter from the file (plus one whole read for the plain load).
    to_q_reads = [size for name, size in reads if name == "blocks.0.attn1.to_q.weight"]
    assert sorted(to_q_reads) == [full.size // 4] * 4 + [full.size]
