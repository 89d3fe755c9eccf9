"""The radial block mask equals the authors' generator (mit-han-lab/radial-attention at 72788d4).

``_authors_mask`` is ``gen_log_mask_shrinked`` of their ``radial_attn/attn_mask.py`` at commit
72788d4 (with ``get_window_width``, ``get_diagonal_split_mask`` and ``shrinkMaskStrict``), in torch on
the CPU, transcribed line for line (the device argument and the sparsity print dropped); ``s`` is the
sequence padded to whole blocks.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from wanjax.kernels.radial import AUTHORS_COMMIT, radial_block_mask

# ---- the authors' code (radial_attn/attn_mask.py @ 72788d4) -------------------------------------


def shrinkMaskStrict(mask, block_size=128):
    seqlen = mask.shape[0]
    block_num = seqlen // block_size
    mask = mask[: block_num * block_size, : block_num * block_size].view(
        block_num, block_size, block_num, block_size
    )
    col_densities = mask.sum(dim=1) / block_size
    non_zero_densities = col_densities > 0
    high_density_cols = col_densities > 1 / 3
    frac_high_density_cols = high_density_cols.sum(dim=-1) / (non_zero_densities.sum(dim=-1) + 1e-9)
    block_mask = frac_high_density_cols > 0.6
    block_mask[0:0] = True
    block_mask[-1:-1] = True
    return block_mask


def get_diagonal_split_mask(i, j, token_per_frame, sparse_type):
    assert sparse_type in ["radial"]
    dist = abs(i - j)
    group = dist.bit_length()
    threshold = 128
    decay_length = 2 ** token_per_frame.bit_length() / 2**group
    if decay_length >= threshold:
        return torch.ones((token_per_frame, token_per_frame), dtype=torch.bool)
    split_factor = int(threshold / decay_length)
    modular = dist % split_factor
    if modular == 0:
        return torch.ones((token_per_frame, token_per_frame), dtype=torch.bool)
    return torch.zeros((token_per_frame, token_per_frame), dtype=torch.bool)


def get_window_width(
    i, j, token_per_frame, sparse_type, num_frame, decay_factor=1, block_size=128, model_type=None
):
    assert sparse_type in ["radial"]
    dist = abs(i - j)
    if model_type == "wan":
        if dist < 1:
            return token_per_frame
        if dist == 1:
            return token_per_frame
    else:
        raise ValueError(f"Unknown model type: {model_type}")
    group = dist.bit_length()
    decay_length = 2 ** token_per_frame.bit_length() / 2**group * decay_factor
    threshold = block_size
    if decay_length >= threshold:
        return decay_length
    return threshold


def gen_log_mask_shrinked(
    s, video_token_num, num_frame, block_size=128, sparse_type="log", decay_factor=0.5, model_type=None
):
    final_log_mask = torch.zeros((s // block_size, s // block_size), dtype=torch.bool)
    token_per_frame = video_token_num // num_frame
    video_text_border = video_token_num // block_size
    col_indices = torch.arange(0, token_per_frame).view(1, -1)
    row_indices = torch.arange(0, token_per_frame).view(-1, 1)
    final_log_mask[video_text_border:] = True
    final_log_mask[:, video_text_border:] = True
    for i in range(num_frame):
        for j in range(num_frame):
            if j == 0 and model_type == "wan":
                local_mask = torch.ones((token_per_frame, token_per_frame), dtype=torch.bool)
            else:
                window_width = get_window_width(
                    i, j, token_per_frame, sparse_type, num_frame, decay_factor, block_size, model_type
                )
                local_mask = torch.abs(col_indices - row_indices) <= window_width
                split_mask = get_diagonal_split_mask(i, j, token_per_frame, sparse_type)
                local_mask = torch.logical_and(local_mask, split_mask)
            remainder_row = (i * token_per_frame) % block_size
            remainder_col = (j * token_per_frame) % block_size
            all_length_row = remainder_row + ((token_per_frame - 1) // block_size + 1) * block_size
            all_length_col = remainder_col + ((token_per_frame - 1) // block_size + 1) * block_size
            padded_local_mask = torch.zeros((all_length_row, all_length_col), dtype=torch.bool)
            padded_local_mask[
                remainder_row : remainder_row + token_per_frame,
                remainder_col : remainder_col + token_per_frame,
            ] = local_mask
            block_mask = shrinkMaskStrict(padded_local_mask, block_size=block_size)
            block_row_start = (i * token_per_frame) // block_size
            block_col_start = (j * token_per_frame) // block_size
            block_row_end = block_row_start + block_mask.shape[0]
            block_col_end = block_col_start + block_mask.shape[1]
            final_log_mask[block_row_start:block_row_end, block_col_start:block_col_end] = torch.logical_or(
                final_log_mask[block_row_start:block_row_end, block_col_start:block_col_end], block_mask
            )
    return final_log_mask


# ---- the comparison ------------------------------------------------------------------------------


def _authors_mask(frames: int, tokens_per_frame: int, decay_factor: float, block_size: int) -> np.ndarray:
    length = frames * tokens_per_frame
    padded = -(-length // block_size) * block_size
    with torch.no_grad():
        mask = gen_log_mask_shrinked(
            padded, length, frames, block_size, "radial", decay_factor=decay_factor, model_type="wan"
        )
    return mask.numpy()


# (latent frames, tokens per frame): 81 frames -> 21 latent frames; a 1280x720 video is 80x45 tokens
# after the VAE's 8x and the patch's 2x, 832x480 is 52x30 (Wan 2.1 14B and 1.3B alike: same VAE/patch).
GRID_720P = (21, 3600)
GRID_480P = (21, 1560)
# The densities the issue quotes from the authors' generator (14B 720p: 30%/40%; 480p: 37%/45%).
QUOTED = {(GRID_720P, 0.5): 0.30, (GRID_720P, 1.0): 0.40, (GRID_480P, 0.5): 0.37, (GRID_480P, 1.0): 0.45}


def _compare(frames: int, tokens: int, decay: float, block: int) -> float:
    ours = radial_block_mask(frames, tokens, decay, block)
    theirs = _authors_mask(frames, tokens, decay, block)
    assert ours.shape == theirs.shape
    np.testing.assert_array_equal(ours, theirs, err_msg=f"vs {AUTHORS_COMMIT}")
    density = float(ours.mean())
    print(f"radial mask {frames}x{tokens} decay {decay} block {block}: density {density:.4f}")
    return density


@pytest.mark.parametrize("decay", [0.2, 0.5, 1.0])
def test_480p_mask_equals_authors(decay):
    """14B and 1.3B at 480p (the same token grid); within a point of the issue's quoted density."""
    density = _compare(*GRID_480P, decay, 128)
    if (GRID_480P, decay) in QUOTED:
        assert abs(density - QUOTED[GRID_480P, decay]) < 0.01
    assert density < 1.0


@pytest.mark.slow
@pytest.mark.parametrize("decay", [0.5])  # the reference's 75,600-token mask costs ~1 min a decay:
def test_720p_mask_equals_authors(decay):  # the other decays run the same code at 480p and below
    density = _compare(*GRID_720P, decay, 128)
    if (GRID_720P, decay) in QUOTED:
        assert abs(density - QUOTED[GRID_720P, decay]) < 0.01


@pytest.mark.parametrize(
    "frames,tokens,decay,block",
    [(5, 24, 1.0, 8), (9, 40, 0.5, 16), (6, 33, 1.0, 8), (17, 16, 0.2, 4), (3, 7, 1.0, 4)],
)
def test_small_grids_equal_authors(frames, tokens, decay, block):
    """Small grids whose test block sizes make the mask sparse, partial blocks and frames that do
    not start on a block boundary included."""
    density = _compare(frames, tokens, decay, block)
    if frames > 4:
        assert density < 0.95
