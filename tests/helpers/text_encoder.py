"""Random UMT5 text encoders (the parity cases) and padded token batches."""

from __future__ import annotations

import numpy as np
from transformers import UMT5Config as HFConfig
from transformers import UMT5EncoderModel

from helpers.models import randomize_

# (name, transformers config, (batch lengths), padded length)
CASES = [
    ("buckets8", dict(vocab_size=320, d_model=32, d_kv=8, num_heads=4, d_ff=40, num_layers=2,
                      relative_attention_num_buckets=8, relative_attention_max_distance=20), (40, 33, 5), 40),
    ("inner48", dict(vocab_size=330, d_model=24, d_kv=16, num_heads=3, d_ff=56, num_layers=3), (150, 1, 77), 150),
]  # fmt: skip


def save_text_encoder(root, seed: int = 0, **config) -> UMT5EncoderModel:
    """A random UMT5EncoderModel saved under ``root/text_encoder``; returns the torch model."""
    model = randomize_(UMT5EncoderModel(HFConfig(**config)), seed).eval()
    model.save_pretrained(root / "text_encoder")
    return model


def padded_batch(lengths, padded: int, vocab: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = np.zeros((len(lengths), padded), np.int64)
    mask = np.zeros((len(lengths), padded), np.int64)
    for row, n in enumerate(lengths):
        ids[row, :n] = rng.integers(1, vocab, n)
        mask[row, :n] = 1
    return ids, mask
