"""wanjax: a JAX-native inference engine for the Wan video models (Wan 2.1 T2V, I2V, FLF2V; Wan 2.2 A14B, TI2V-5B).

The public names below are imported on first use (PEP 562), so ``import wanjax.models.vae`` (or the
CLI's ``--help``) does not load the transformer, the text encoder, the tokenizer and the Pallas kernels.
"""

from __future__ import annotations

import importlib

from wanjax.version import __version__

TYPE_CHECKING = False  # not typing's: the console script's first import stays short (cli/launch.py)

_EXPORTS = {
    "CacheConfig": "wanjax.sampling.cache.step_cache",
    "CheckpointError": "wanjax.errors",
    "ConfigError": "wanjax.errors",
    "RadialAttention": "wanjax.kernels.radial",
    "SchedulerConfig": "wanjax.sampling.scheduler",
    "Tiling": "wanjax.models.vae",
    "Tokenizer": "wanjax.models.tokenizer",
    "TransformerConfig": "wanjax.models.config",
    "UMT5Config": "wanjax.models.umt5",
    "UMT5Encoder": "wanjax.models.umt5",
    "VAEConfig": "wanjax.models.vae.config",
    "WanPipeline": "wanjax.pipeline.pipeline",
    "WanTransformer": "wanjax.models.dit",
    "WanVAE": "wanjax.models.vae",
    "WanjaxError": "wanjax.errors",
    "load_text_encoder": "wanjax.pipeline.loaders",
    "load_tokenizer": "wanjax.pipeline.loaders",
    "load_transformer": "wanjax.pipeline.loaders",
    "load_vae": "wanjax.pipeline.loaders",
    "make_scheduler": "wanjax.pipeline.loaders",
    "prompt_clean": "wanjax.models.tokenizer",
}

__all__ = [
    "CacheConfig",
    "CheckpointError",
    "ConfigError",
    "RadialAttention",
    "SchedulerConfig",
    "Tiling",
    "Tokenizer",
    "TransformerConfig",
    "UMT5Config",
    "UMT5Encoder",
    "VAEConfig",
    "WanPipeline",
    "WanTransformer",
    "WanVAE",
    "WanjaxError",
    "__version__",
    "load_text_encoder",
    "load_tokenizer",
    "load_transformer",
    "load_vae",
    "make_scheduler",
    "prompt_clean",
]

if TYPE_CHECKING:
    from typing import Any

    from wanjax.errors import CheckpointError, ConfigError, WanjaxError
    from wanjax.kernels.radial import RadialAttention
    from wanjax.models.config import TransformerConfig
    from wanjax.models.dit import WanTransformer
    from wanjax.models.tokenizer import Tokenizer, prompt_clean
    from wanjax.models.umt5 import UMT5Config, UMT5Encoder
    from wanjax.models.vae import Tiling, WanVAE
    from wanjax.models.vae.config import VAEConfig
    from wanjax.pipeline.loaders import (
        load_text_encoder,
        load_tokenizer,
        load_transformer,
        load_vae,
        make_scheduler,
    )
    from wanjax.pipeline.pipeline import WanPipeline
    from wanjax.sampling.cache.step_cache import CacheConfig
    from wanjax.sampling.scheduler import SchedulerConfig


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'wanjax' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
