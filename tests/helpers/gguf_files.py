"""GGUF files for tests: written with the ``gguf`` package as city96's tools write them, and read back
as diffusers reads and dequantises them."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType
# Types gguf can quantise (F32/F16 are casts), and the others by the byte offsets of their float16
# scales (written as random blocks with those scales set to finite values).
QUANTISABLE = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1]
RANDOM_BLOCKS = {
    Q.Q2_K: (80, 82),
    Q.Q3_K: (108,),
    Q.Q4_K: (0, 2),
    Q.Q5_K: (0, 2),
    Q.Q6_K: (208,),
    Q.IQ4_NL: (0,),
    Q.IQ4_XS: (0,),
}


def random_blocks(
    qtype: Q, shape: tuple[int, ...], rng: np.random.Generator, scale: float = 0.05
) -> np.ndarray:
    """Random bytes of a ``qtype`` tensor of ``shape`` (byte shape), with finite float16 scales in
    ``±scale``."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = int(np.prod(shape)) // block
    raw = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    for at in RANDOM_BLOCKS[qtype]:
        scales = rng.uniform(-scale, scale, n_blocks).astype(np.float16)
        raw[:, at : at + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(*shape[:-1], shape[-1] // block * size)


def add(writer: gguf.GGUFWriter, name: str, values: np.ndarray, qtype: Q) -> None:
    """Add a tensor as city96's convert.py does: quantised bytes with ``raw_dtype``."""
    writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)


def write(path: Path, tensors: dict, metadata: dict | None = None, arch: str = "wan") -> Path:
    """A GGUF file of ``{name: (qtype, numpy values or raw bytes)}`` (arch ``wan``, as city96's
    transformers; ``t5encoder`` for a text encoder)."""
    writer = gguf.GGUFWriter(path, arch=arch)
    for key, value in (metadata or {}).items():
        writer.add_array(key, value)
    for name, (qtype, data) in tensors.items():
        if qtype in RANDOM_BLOCKS or data.dtype == np.uint8:
            writer.add_tensor(name, data, raw_dtype=qtype)
        else:
            add(writer, name, data, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# A tiny transformer whose matmul inputs are 256 wide: whole Q8_0 (32) and K-quant (256) blocks per row.
GGUF_DIT = {"attention_head_dim": 128, "ffn_dim": 256, "text_dim": 256, "freq_dim": 256}


def write_transformer(
    path: Path, state: dict[str, np.ndarray], qtype: Q, seed: int = 0, scale: float = 0.05
) -> Path:
    """A transformer's tensors (original names) as city96's files hold them: the 2-D matmul weights
    in ``qtype`` (random blocks, scales in ``±scale``, for the types gguf cannot quantise), the rest
    float32."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, w in state.items():
        if w.ndim == 2 and name.endswith(".weight"):
            tensors[name] = (
                qtype,
                random_blocks(qtype, w.shape, rng, scale) if qtype in RANDOM_BLOCKS else w,
            )
        else:
            tensors[name] = (Q.F32, w)
    return write(path, tensors)


def diffusers_values(path: Path) -> dict[str, np.ndarray]:
    """Every tensor as diffusers reads and dequantises it, in float32 on the CPU."""
    from diffusers.models.model_loading_utils import load_gguf_checkpoint

    return {name: dequantized_in_float32(t).numpy() for name, t in load_gguf_checkpoint(str(path)).items()}


def dequantized_in_float32(tensor):
    """diffusers' ``dequantize_gguf_tensor``, but in float32 where it leaves the dtype None (float16
    scale arithmetic); plain tensors (F32, F16) as they are."""
    import torch
    from diffusers.quantizers.gguf import utils

    if not hasattr(tensor, "quant_type"):
        return tensor
    block, size = utils.GGML_QUANT_SIZES[tensor.quant_type]
    raw = tensor.as_tensor().view(torch.uint8)
    fn = utils.dequantize_functions[tensor.quant_type]
    values = fn(raw.reshape(-1, size), block, size, dtype=torch.float32)
    return values.reshape(*raw.shape[:-1], raw.shape[-1] // size * block)
