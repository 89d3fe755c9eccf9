"""GGUF checkpoints: shapes in PyTorch order, values equal to diffusers' dequantisation, row slices,
city96's original-shape metadata, and one-line errors for bad files."""

from __future__ import annotations

from pathlib import Path

import gguf
import ml_dtypes
import numpy as np
import pytest
from helpers.gguf_files import QUANTISABLE, RANDOM_BLOCKS, Q, diffusers_values, random_blocks, write

from wanjax.errors import CheckpointError
from wanjax.io import gguf_file
from wanjax.io.gguf_file import ORIG_SHAPE_KEY, GGUFRef, open_gguf, supported_types

SHAPE = (64, 256)  # a Linear weight (out, in)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(0)
    tensors: dict[str, tuple[Q, np.ndarray]] = {}
    for qtype in QUANTISABLE:
        tensors[f"{qtype.name}.weight"] = (qtype, rng.standard_normal(SHAPE).astype(np.float32))
    for qtype in RANDOM_BLOCKS:
        tensors[f"{qtype.name}.weight"] = (qtype, random_blocks(qtype, SHAPE, rng))
    tensors["head.modulation"] = (Q.F32, rng.standard_normal((1, 2, 64)).astype(np.float32))
    tensors["blocks.0.norm3.bias"] = (Q.F32, rng.standard_normal(64).astype(np.float32))
    # Wan's 5-D patch embedding as fix_5d_tensors.py adds it back: F32, all five dimensions.
    tensors["patch_embedding.weight"] = (Q.F32, rng.standard_normal((32, 16, 1, 2, 2)).astype(np.float32))
    # convert.py's shape_fix: a tensor whose last dimension is not a multiple of 256, stored as
    # (n / 256, 256) with its shape in the metadata (rows of 24 values straddle Q8_0's 32-blocks).
    reshaped = rng.standard_normal((32, 3, 1, 2, 4)).astype(np.float32)
    tensors["conv.weight"] = (Q.Q8_0, reshaped.reshape(-1, 256))
    metadata = {ORIG_SHAPE_KEY + "conv.weight": tuple(int(n) for n in reshaped.shape)}
    return write(tmp_path_factory.mktemp("gguf") / "model.gguf", tensors, metadata)


def test_types_and_shapes(model: Path) -> None:
    refs = open_gguf(model)
    assert all(isinstance(r, GGUFRef) and r.file == model for r in refs.values())
    for qtype in [*QUANTISABLE, *RANDOM_BLOCKS]:
        ref = refs[f"{qtype.name}.weight"]
        assert ref.shape == SHAPE  # PyTorch (out, in), not GGUF's ne order (256, 64)
        assert ref.quant_type == qtype.name
    assert refs["F32.weight"].dtype == np.float32
    assert refs["F16.weight"].dtype == np.float16
    assert refs["BF16.weight"].dtype == np.dtype(ml_dtypes.bfloat16)
    assert {refs[f"{q.name}.weight"].dtype for q in [Q.Q8_0, Q.Q4_K, Q.IQ4_XS]} == {np.dtype(np.float32)}
    assert refs["head.modulation"].shape == (1, 2, 64)
    assert refs["blocks.0.norm3.bias"].shape == (64,)
    assert refs["patch_embedding.weight"].shape == (32, 16, 1, 2, 2)
    assert refs["conv.weight"].shape == (32, 3, 1, 2, 4)
    for ref in refs.values():
        assert ref.array().shape == ref.shape and ref.array().dtype == ref.dtype


def test_values_match_diffusers(model: Path) -> None:
    refs = open_gguf(model)
    expected = diffusers_values(model)
    assert expected.keys() == refs.keys()
    for name, ref in refs.items():
        want = expected[name]
        if name == "conv.weight":  # diffusers ignores comfy.gguf.orig_shape: stored (3, 256)
            assert want.shape == (3, 256)
            want = want.reshape(ref.shape)
        np.testing.assert_array_equal(ref.array().astype(np.float32), want, err_msg=name)
        assert np.isfinite(want).all(), name


def test_float_values_are_stored_values(tmp_path: Path) -> None:
    values = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)
    refs = open_gguf(write(tmp_path / "f.gguf", {"a": (Q.F32, values), "b": (Q.F16, values)}))
    np.testing.assert_array_equal(refs["a"].array(), values)
    np.testing.assert_array_equal(refs["b"].array(), values.astype(np.float16))
    # Q8_0 quantised by gguf and dequantised again: close to the values
    q8 = open_gguf(write(tmp_path / "q.gguf", {"c": (Q.Q8_0, values)}))["c"].array()
    np.testing.assert_allclose(q8, values, atol=np.abs(values).max() / 100)


@pytest.mark.parametrize(
    "index",
    [
        (slice(2, 5), slice(None)),
        (slice(None, None, 3), slice(7, 200, 2)),
        (slice(40, 0, -5), slice(None)),
        (slice(9, 9), slice(None)),
    ],
)
def test_slices_equal_slices_of_array(model: Path, index: tuple[slice, ...]) -> None:
    for name, ref in open_gguf(model).items():
        full = ref.array()
        if ref.shape[0] < 2:
            continue
        want = full[(index[0], *(slice(None),) * (len(ref.shape) - 1))]
        np.testing.assert_array_equal(ref[(index[0],)], want, err_msg=name)
        if len(ref.shape) == 2:
            np.testing.assert_array_equal(ref[index], full[index], err_msg=name)
    conv = open_gguf(model)["conv.weight"]  # rows straddling quantisation blocks
    index5 = (slice(3, 30, 7), slice(1, 3), slice(None), slice(None, None, -1), slice(1, 4))
    np.testing.assert_array_equal(conv[index5], conv.array()[index5])


def test_rows_read_are_only_those_asked_for(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = open_gguf(model)["Q4_K.weight"]
    seen = []
    dequantize = gguf.quants.dequantize
    monkeypatch.setattr(
        gguf.quants, "dequantize", lambda raw, q: seen.append(raw.shape) or dequantize(raw, q)
    )
    ref[(slice(2, 5), slice(None))]
    assert seen == [(1, 3 * 144)]  # 3 rows of one 256-value block each


def test_chunked_dequantisation(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    refs = open_gguf(model)
    whole = {name: ref.array() for name, ref in refs.items()}
    monkeypatch.setattr(gguf_file, "_CHUNK", 96)  # calls of 3 blocks of 32, 1 of 256
    for name, ref in refs.items():
        np.testing.assert_array_equal(ref.array(), whole[name], err_msg=name)
    index = (slice(5, 27), slice(None), slice(None), slice(None), slice(1, 3))
    np.testing.assert_array_equal(refs["conv.weight"][index], whole["conv.weight"][index])


def test_supported_types() -> None:
    names = supported_types()
    for qtype in [*QUANTISABLE, *RANDOM_BLOCKS]:
        assert qtype.name in names
    assert "Q8_1" not in names and "I32" not in names


def _error(path: Path) -> str:
    with pytest.raises(CheckpointError) as e:
        open_gguf(path)
    message = str(e.value)
    assert "\n" not in message and str(path) in message
    return message


def test_bad_magic(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04" + bytes(100))
    assert "not a GGUF file" in _error(path)
    path.write_bytes(b"")
    assert "not a GGUF file" in _error(path)


def test_truncated(tmp_path: Path) -> None:
    values = np.random.default_rng(2).standard_normal(SHAPE).astype(np.float32)
    path = write(
        tmp_path / "model.gguf",
        {"a": (Q.F16, values), "b": (Q.Q4_K, random_blocks(Q.Q4_K, SHAPE, np.random.default_rng(3)))},
    )
    size = path.stat().st_size
    data = path.read_bytes()
    path.write_bytes(data[: size - 144 * 64 // 2])  # in the middle of b's data
    message = _error(path)
    assert "truncated file" in message and "tensor b" in message and message.endswith("download it again")
    path.write_bytes(data[:40])  # in the header
    assert "truncated" in _error(path)


def test_type_gguf_cannot_dequantise(tmp_path: Path) -> None:
    block, size = gguf.GGML_QUANT_SIZES[Q.Q8_1]
    raw = np.zeros((4, 64 // block * size), np.uint8)
    path = write(tmp_path / "model.gguf", {"ok": (Q.F32, np.ones(4, np.float32)), "w": (Q.Q8_1, raw)})
    message = _error(path)
    assert "tensor w" in message and "Q8_1" in message and "Q4_K" in message


def test_unknown_type(tmp_path: Path) -> None:
    path = write(tmp_path / "model.gguf", {"blocks.0.w": (Q.F32, np.ones((2, 32), np.float32))})
    data = bytearray(path.read_bytes())
    name = b"blocks.0.w"
    at = data.index(name) + len(name) + 4 + 8 * 2  # after the name: n_dims (u32), ne (2 x u64), type (u32)
    assert int.from_bytes(data[at : at + 4], "little") == Q.F32
    data[at : at + 4] = (4).to_bytes(4, "little")  # Q4_2, long removed from GGML
    path.write_bytes(bytes(data))
    message = _error(path)
    assert "tensor blocks.0.w" in message and "#4" in message and "Q8_0" in message
