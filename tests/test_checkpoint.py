"""Checkpoint loading: every kind of mismatch between files and config is a clear CheckpointError."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import wanjax
from wanjax.errors import CheckpointError, ConfigError
from wanjax.io.checkpoint import REPLICATED, LeafSource, copy_into, linear_kernel, open_component

WEIGHTS = "diffusion_pytorch_model.safetensors"


@pytest.fixture
def model_copy(tmp_path, tiny_transformer_dir):
    root, _ = tiny_transformer_dir
    shutil.copytree(root, tmp_path / "model")
    return tmp_path / "model"


def rewrite(model_dir, edit):
    path = model_dir / "transformer" / WEIGHTS
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


def test_missing_key(model_copy):
    rewrite(model_copy, lambda t: t.pop("blocks.1.attn2.to_k.bias"))
    with pytest.raises(CheckpointError, match=r"missing tensors: blocks\.1\.attn2\.to_k\.bias"):
        wanjax.load_transformer(model_copy)


def test_unexpected_key(model_copy):
    rewrite(model_copy, lambda t: t.update({"blocks.0.attn1.extra.weight": torch.zeros(3)}))
    with pytest.raises(CheckpointError, match=r"unexpected tensors: blocks\.0\.attn1\.extra\.weight"):
        wanjax.load_transformer(model_copy)


def test_wrong_shape(model_copy):
    rewrite(model_copy, lambda t: t.update({"proj_out.bias": torch.zeros(65)}))
    with pytest.raises(CheckpointError, match=r"shape mismatch: proj_out\.bias \(65,\) \(expected \(64,\)\)"):
        wanjax.load_transformer(model_copy)


def test_all_problems_reported_together(model_copy):
    def edit(t):
        t.pop("proj_out.weight")
        t["unknown"] = torch.zeros(1)

    rewrite(model_copy, edit)
    with pytest.raises(
        CheckpointError, match=r"missing tensors: proj_out\.weight; unexpected tensors: unknown"
    ):
        wanjax.load_transformer(model_copy)


def test_missing_weights_file(model_copy):
    (model_copy / "transformer" / WEIGHTS).unlink()
    with pytest.raises(CheckpointError, match="no weights found"):
        wanjax.load_transformer(model_copy)


def test_missing_shard_file(tmp_path, tiny_transformer_dir):
    _, model = tiny_transformer_dir
    model.save_pretrained(tmp_path / "transformer", max_shard_size="20KB")
    shards = sorted((tmp_path / "transformer").glob("*-of-*.safetensors"))
    shards[1].unlink()
    with pytest.raises(CheckpointError, match=f"shard file\\(s\\) missing: {shards[1].name}"):
        wanjax.load_transformer(tmp_path)


def test_truncated_file(model_copy):
    path = model_copy / "transformer" / WEIGHTS
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    with pytest.raises(CheckpointError, match="truncated file"):
        wanjax.load_transformer(model_copy)


def test_corrupt_header(model_copy):
    path = model_copy / "transformer" / WEIGHTS
    path.write_bytes((16).to_bytes(8, "little") + b"{not json at all" + b"\0" * 64)
    with pytest.raises(CheckpointError, match="corrupt safetensors header"):
        wanjax.load_transformer(model_copy)


def test_pickle_weights_refused(model_copy):
    (model_copy / "transformer" / WEIGHTS).rename(model_copy / "transformer" / "diffusion_pytorch_model.bin")
    with pytest.raises(CheckpointError, match="safetensors only"):
        wanjax.load_transformer(model_copy)


def test_model_path_missing(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        wanjax.load_transformer(tmp_path / "nope")


def test_directory_without_transformer(tmp_path):
    with pytest.raises(CheckpointError, match=r"no transformer/config\.json"):
        wanjax.load_transformer(tmp_path)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("num_experts", 8, r"unknown field.*num_experts"), ("image_dim", 1280, "image-to-video")],
)
def test_config_values_wanjax_cannot_run_are_rejected(model_copy, field, value, message):
    cfg_path = model_copy / "transformer" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg[field] = value
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=message):
        wanjax.load_transformer(model_copy)


def test_config_round_trip_keeps_metadata(tiny_transformer_dir):
    root, model = tiny_transformer_dir
    cfg = wanjax.TransformerConfig.from_file(root / "transformer" / "config.json")
    assert cfg.metadata["_class_name"] == "WanTransformer3DModel"
    assert cfg.num_layers == model.config.num_layers and cfg.patch_size == (1, 2, 2)
    on_disk = json.loads((root / "transformer" / "config.json").read_text())
    assert {k: v for k, v in cfg.to_dict().items() if k in on_disk} == on_disk


def test_tensor_refs_read_whole_tensors_and_slices(tiny_transformer_dir):
    root, model = tiny_transformer_dir
    refs = open_component(root / "transformer", ["diffusion_pytorch_model"])
    ref, expected = refs["proj_out.weight"], model.proj_out.weight.detach().numpy()
    assert ref.shape == expected.shape and ref.dtype == np.float32
    np.testing.assert_array_equal(ref.array(), expected)
    np.testing.assert_array_equal(ref[(slice(8, 16), slice(3, 5))], expected[8:16, 3:5])


def test_files_are_released_after_loading(tiny_transformer_dir):
    root, _ = tiny_transformer_dir
    weights = str(root / "transformer" / WEIGHTS)
    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("needs /proc")
    wanjax.load_transformer(root, dtype="float32")
    assert weights not in maps.read_text()


def test_unsupported_dtype_is_named(tmp_path):
    path = tmp_path / WEIGHTS
    header = json.dumps({"w": {"dtype": "F8_E8M0", "shape": [2], "data_offsets": [0, 2]}}).encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0\0")
    with pytest.raises(CheckpointError, match="tensor w has unsupported dtype F8_E8M0"):
        open_component(tmp_path, ["diffusion_pytorch_model"])


def test_sharded_load_reads_slices_and_is_bit_exact(tmp_path, monkeypatch):
    """8 devices: each reads only its slice of a transposed kernel (stacked or not) and of a vector;
    every shard equals NumPy's transpose of the whole tensor, bit for bit, in float32 and bf16."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    from safetensors.numpy import save_file as save_numpy

    from wanjax.io.checkpoint import TensorRef, load_params, random_checkpoint, stacked

    spec = {
        "stacked": stacked("blocks.{i}.w", 4, (24, 16), layout=linear_kernel, axes=REPLICATED),
        "kernel": LeafSource(("proj.weight",), (40, 16), linear_kernel, axes=REPLICATED),
        "vector": LeafSource(("proj.bias",), (40,), axes=REPLICATED),
        "conv": LeafSource(
            ("conv.weight",), (8, 4, 3, 3), lambda a: a.transpose(2, 3, 1, 0), axes=REPLICATED
        ),
    }
    partition = {  # mesh x=2, y=4: layers and transposed axes split; a layout that is no Transpose too
        "blocks.0.w": P("x", None, "y"), "proj.weight": P("x", "y"), "proj.bias": P("y"),
        "conv.weight": P(None, None, None, "y"),
    }  # fmt: skip
    assert len(jax.devices()) == 8
    mesh = jax.make_mesh((2, 4), ("x", "y"))
    tensors = random_checkpoint(spec)
    save_numpy(tensors, str(tmp_path / "model.safetensors"))
    reads = []
    get, whole = TensorRef.__getitem__, TensorRef.array
    monkeypatch.setattr(
        TensorRef,
        "__getitem__",
        lambda self, index: reads.append((self.name, get(self, index).size)) or get(self, index),
    )
    monkeypatch.setattr(TensorRef, "array", lambda self: reads.append((self.name, "whole")) or whole(self))
    for dtype in (np.float32, ml_dtypes.bfloat16):
        refs = open_component(tmp_path, ["model"])
        params = load_params(refs, spec, dtype, "test", lambda s: NamedSharding(mesh, partition[s.names[0]]))
        for key, source in spec.items():
            if source.stacked:
                full = np.stack([source.layout(tensors[n]) for n in source.names])
            else:
                full = source.layout(tensors[source.names[0]])
            for shard in params[key].addressable_shards:
                expected = full[shard.index].astype(dtype)
                assert np.asarray(shard.data).tobytes() == expected.tobytes(), (key, dtype, shard.index)
    expected = {(f"blocks.{i}.w", 24 // 4 * 16) for i in range(4)}  # a quarter of each layer
    expected |= {("proj.weight", 40 // 4 * 16 // 2), ("proj.bias", 40 // 4), ("conv.weight", "whole")}
    assert set(reads) == expected


def test_bfloat16_checkpoint_is_read(tmp_path, tiny_transformer_dir):
    """Real Wan text encoders ship in bf16: the reader must decode bf16 without torch."""
    _, model = tiny_transformer_dir
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(tmp_path / "transformer")
    refs = open_component(tmp_path / "transformer", ["diffusion_pytorch_model"])
    ours = refs["proj_out.weight"].array().astype(np.float32)
    np.testing.assert_array_equal(ours, model.proj_out.weight.detach().bfloat16().float().numpy())


@pytest.mark.parametrize(
    ("shape", "axes", "dtype"),
    [
        ((300, 259), (1, 0), np.float32),  # Linear weight.T, sizes not multiples of the tile
        ((5, 130, 140), (0, 2, 1), ml_dtypes.bfloat16),  # stacked, bf16 kept
        ((64, 48, 3, 3, 3), (2, 3, 4, 1, 0), np.float32),  # conv kernel to (T, H, W, I, O)
    ],
)
def test_tiled_copy_equals_numpy_copy(shape, axes, dtype):
    src = np.random.default_rng(0).standard_normal(shape).astype(dtype).transpose(axes)
    dst = np.empty(src.shape, dtype)
    copy_into(dst, src)
    np.testing.assert_array_equal(dst, np.ascontiguousarray(src))


def test_a_leaf_declares_its_axes_when_it_is_defined():
    with pytest.raises(TypeError, match="axes"):
        LeafSource(("w",), (4, 8))  # no axes: an error, not a silent replication
    with pytest.raises(ValueError, match="2 dimensions"):
        LeafSource(("w",), (4, 8), axes=("embed",))
    assert LeafSource(("w",), (4, 8), axes=REPLICATED).axes == (None, None)
    kernel = LeafSource(("w",), (4, 8), linear_kernel, axes=("embed", "heads"), alt_axes=((None, "mlp"),))
    assert kernel.candidate_axes == (("embed", "heads"), (None, "mlp"))
