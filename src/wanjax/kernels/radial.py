"""Radial attention's block mask (Li et al. 2025, "Radial Attention: O(n log n) Sparse Attention with
Energy Decay for Long Video Generation"), as its authors generate it.

The authors' generator is ``gen_log_mask_shrinked`` of ``radial_attn/attn_mask.py`` in
mit-han-lab/radial-attention at commit 72788d4, with ``model_type="wan"``: for every pair of latent
frames ``(i, j)`` a token mask (the whole frame for the sink frame ``j = 0``; else a band
``|col - row| <= window`` whose window halves as ``|i - j|`` doubles, kept only on every
``split``-th frame distance once the band is narrower than 128) is placed at the frame pair's token
offsets, shrunk to ``block_size`` blocks by ``shrinkMaskStrict`` (a block is kept when more than 60%
of its non-empty columns are more than a third full) and OR-ed into the block mask.

The sequence is padded to whole blocks (``s`` of the authors' call rounded up to ``block_size``, as
their ``__main__`` does): the last, partial block's row and column stay dense, as their
``final_log_mask[video_text_border:] = True`` keeps every block past the video's whole blocks.

:func:`radial_block_mask` computes the same mask in closed form per frame pair (each column's rows
inside the band are an interval), so the 75,600-token grid of a 720p video takes milliseconds; it is
cached by its arguments. ``tests/test_radial_mask.py`` compares it with the authors' code.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from wanjax.errors import ConfigError
from wanjax.kernels.block_mask import BlockMask

__all__ = ["AUTHORS_COMMIT", "MASK_BLOCK", "SPARSE_ATTENTION", "RadialAttention", "radial_block_mask"]

SPARSE_ATTENTION = ("off", "radial")  # --sparse_attention's choices

AUTHORS_COMMIT = "mit-han-lab/radial-attention@72788d4"
MASK_BLOCK = 128  # the authors' block size for Wan (``RadialAttention(..., block_size=128)``)
SPLIT_THRESHOLD = 128  # ``get_diagonal_split_mask``'s hard-coded threshold (not the block size)


def _window(dist: int, tokens_per_frame: int, decay_factor: float, block_size: int) -> float:
    """``get_window_width`` for ``model_type="wan"``: the band's half-width at frame distance ``dist``."""
    if dist <= 1:
        return float(tokens_per_frame)
    decay = 2 ** tokens_per_frame.bit_length() / 2 ** dist.bit_length() * decay_factor
    return decay if decay >= block_size else float(block_size)


def _split_keeps(dist: int, tokens_per_frame: int) -> bool:
    """``get_diagonal_split_mask``: whether frame distance ``dist`` keeps its band (all or nothing)."""
    decay = 2 ** tokens_per_frame.bit_length() / 2 ** dist.bit_length()
    if decay >= SPLIT_THRESHOLD:
        return True
    return dist % int(SPLIT_THRESHOLD / decay) == 0


def _shrunk_band(width: int, row_rem: int, col_rem: int, tokens: int, block_size: int) -> np.ndarray:
    """``shrinkMaskStrict`` of the frame pair's padded token mask: ones where ``|c - r| <= width``
    inside the ``tokens`` x ``tokens`` square at ``(row_rem, col_rem)``; ``(n, n)`` blocks,
    ``n = ceil(tokens / block_size)`` (the authors cut both axes to the rows' whole blocks)."""
    n = -(-tokens // block_size)
    cols = np.arange(n * block_size)
    inside = (cols >= col_rem) & (cols < col_rem + tokens)
    # rows r of the band for column c: |(c - col_rem) - (r - row_rem)| <= width, r in the square
    centre = cols - col_rem + row_rem
    lo = np.maximum(centre - width, row_rem)
    hi = np.minimum(centre + width, row_rem + tokens - 1)
    starts = np.arange(n)[:, None] * block_size
    counts = np.minimum(hi[None], starts + block_size - 1) - np.maximum(lo[None], starts) + 1
    counts = np.where(inside[None], np.maximum(counts, 0), 0).reshape(n, n, block_size)
    nonzero = (counts > 0).sum(-1)
    dense = (3 * counts > block_size).sum(-1)  # column density > 1/3
    return 5 * dense > 3 * nonzero  # more than 60% of the non-empty columns


@functools.lru_cache(maxsize=32)
def radial_block_mask(
    frames: int, tokens_per_frame: int, decay_factor: float = 1.0, block_size: int = MASK_BLOCK
) -> np.ndarray:
    """The radial block mask of a video of ``frames`` latent frames of ``tokens_per_frame`` tokens
    (frame-major): bool ``(n, n)``, ``n = ceil(frames * tokens_per_frame / block_size)``; block
    ``(a, b)`` says whether queries of block ``a`` attend to keys of block ``b``. Read-only (cached)."""
    length = frames * tokens_per_frame
    n = -(-length // block_size)
    mask = np.zeros((n, n), bool)
    border = length // block_size
    mask[border:] = True
    mask[:, border:] = True
    full_width = tokens_per_frame  # |c - r| <= tokens - 1 everywhere in the square
    for i in range(frames):
        for j in range(frames):
            dist = abs(i - j)
            if j == 0:  # the attention sink: the first frame is seen whole
                width = full_width
            elif _split_keeps(dist, tokens_per_frame):
                width = int(np.floor(_window(dist, tokens_per_frame, decay_factor, block_size)))
            else:
                continue
            block = _shrunk_band_cached(
                min(width, full_width),
                (i * tokens_per_frame) % block_size,
                (j * tokens_per_frame) % block_size,
                tokens_per_frame,
                block_size,
            )
            r, c = (i * tokens_per_frame) // block_size, (j * tokens_per_frame) // block_size
            mask[r : r + block.shape[0], c : c + block.shape[1]] |= block
    mask.flags.writeable = False
    return mask


_shrunk_band_cached = functools.lru_cache(maxsize=4096)(_shrunk_band)


@dataclasses.dataclass(frozen=True)
class RadialAttention:
    """Radial attention's settings, by the authors' names (``WanSparseAttnProcessor``): steps
    ``i < dense_timestep`` and blocks ``< dense_block`` run dense attention, the others the radial
    mask of ``decay_factor`` (their processor's default 1.0; their Wan script runs 0.2 with 12 dense
    steps and 1 dense block)."""

    decay_factor: float = 1.0
    dense_timestep: int = 0
    dense_block: int = 0

    def __post_init__(self) -> None:
        if not self.decay_factor > 0:
            raise ConfigError(f"--sparse_option decay_factor must be > 0, got {self.decay_factor}")
        for name in ("dense_timestep", "dense_block"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--sparse_option {name} must be >= 0, got {getattr(self, name)}")

    @classmethod
    def of(cls, options: dict[str, str]) -> RadialAttention:
        """From ``--sparse_option NAME=VALUE`` texts (ConfigError naming an unknown name or a bad value)."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, float | int] = {}
        for name, text in options.items():
            if name not in fields:
                raise ConfigError(
                    f"unknown --sparse_option {name!r} for radial attention; valid: {', '.join(fields)}"
                )
            kind = float if name == "decay_factor" else int
            try:
                values[name] = kind(text)
            except ValueError:
                raise ConfigError(f"--sparse_option {name}={text!r}: not a {kind.__name__}") from None
        return cls(**values)

    def sparse_step(self, step: int) -> bool:
        """Whether step ``step`` (0-based, of the whole schedule) runs sparse."""
        return step >= self.dense_timestep

    def block_mask(self, grid: tuple[int, int, int]) -> BlockMask:
        """The self-attention mask of a ``(frames, height, width)`` token grid (frame-major tokens)."""
        frames, height, width = grid
        table = radial_block_mask(frames, height * width, float(self.decay_factor))
        return BlockMask(table, MASK_BLOCK, frames * height * width)
