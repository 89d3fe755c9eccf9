"""wanjax: a JAX-native inference engine for Wan 2.1 text-to-video.

The public names below are imported on first use (PEP 562), so ``import wanjax.models.vae`` (or the
CLI's ``--help``) does not load the transformer, the text encoder, the tokenizer and the Pallas kernels.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "CheckpointError": "wanjax.errors",
    "ConfigError": "wanjax.errors",
    "SchedulerConfig": "wanjax.scheduler",
    "Tiling": "wanjax.models.vae",
    "Tokenizer": "wanjax.tokenizer",
    "TransformerConfig": "wanjax.config",
    "UMT5Config": "wanjax.models.umt5",
    "UMT5Encoder": "wanjax.models.umt5",
    "VAEConfig": "wanjax.models.vae_config",
    "WanPipeline": "wanjax.pipeline",
    "WanTransformer": "wanjax.models.dit",
    "WanVAE": "wanjax.models.vae",
    "WanjaxError": "wanjax.errors",
    "load_text_encoder": "wanjax.models.umt5",
    "load_tokenizer": "wanjax.tokenizer",
    "load_transformer": "wanjax.models.dit",
    "load_vae": "wanjax.models.vae",
    "make_scheduler": "wanjax.scheduler",
    "prompt_clean": "wanjax.tokenizer",
}

__all__ = [
    "CheckpointError",
    "ConfigError",
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
    from wanjax.config import TransformerConfig
    from wanjax.errors import CheckpointError, ConfigError, WanjaxError
    from wanjax.models.dit import WanTransformer, load_transformer
    from wanjax.models.umt5 import UMT5Config, UMT5Encoder, load_text_encoder
    from wanjax.models.vae import Tiling, WanVAE, load_vae
    from wanjax.models.vae_config import VAEConfig
    from wanjax.pipeline import WanPipeline
    from wanjax.scheduler import SchedulerConfig, make_scheduler
    from wanjax.tokenizer import Tokenizer, load_tokenizer, prompt_clean


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'wanjax' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
