"""The DiT parity inputs (torch-drawn) and our transformer's forward on them."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch


def reference_inputs(shape, text_len, text_dim, seed):
    gen = torch.Generator().manual_seed(seed)
    latents = torch.randn(shape, generator=gen)
    timestep = torch.tensor([999, 417][: shape[0]])
    text = torch.randn((shape[0], text_len, text_dim), generator=gen)
    return latents, timestep, text


def run_ours(model, inputs):
    latents, timestep, text = (jnp.asarray(t.numpy()) for t in inputs)
    return np.asarray(model(latents, timestep, text).astype(jnp.float32))
