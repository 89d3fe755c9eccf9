"""The Python API's shape: components passed in are used as they are."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from wanjax.models.dit import load_transformer
from wanjax.pipeline.pipeline import WanPipeline


@pytest.mark.slow
def test_a_transformer_passed_in_is_used_and_denoises_as_the_loaded_one(demo_env):
    """As diffusers' pipelines take components: the pipeline runs the given transformer (not a copy read
    from the checkpoint), and denoises exactly as a pipeline that loads it itself."""
    plain = WanPipeline.from_pretrained("demo", "float32", jax_cache_dir=False)
    given = load_transformer(plain.components.path, "float32")
    pipe = WanPipeline.from_pretrained("demo", "float32", jax_cache_dir=False, transformer=given)
    assert pipe.transformer is given and plain.transformer is not given
    text = jax.random.normal(jax.random.key(0), (1, 8, given.cfg.text_dim))
    noise = plain.prepare_latents(1, 64, 64, 5, seed=0)
    run = dict(num_inference_steps=2, progress=False)
    out = pipe.denoise(text, text * 0.5, noise, **run).latents
    np.testing.assert_array_equal(
        np.asarray(out), np.asarray(plain.denoise(text, text * 0.5, noise, **run).latents)
    )
