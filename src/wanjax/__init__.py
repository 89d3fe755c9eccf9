"""wanjax: a JAX-native inference engine for Wan 2.1 text-to-video."""

from wanjax.config import TransformerConfig
from wanjax.errors import CheckpointError, ConfigError, WanjaxError
from wanjax.models.dit import WanTransformer, load_transformer
from wanjax.models.umt5 import UMT5Config, UMT5Encoder, load_text_encoder
from wanjax.models.vae import Tiling, WanVAE, load_vae
from wanjax.models.vae_config import VAEConfig
from wanjax.pipeline import WanPipeline
from wanjax.scheduler import SchedulerConfig, make_scheduler
from wanjax.tokenizer import Tokenizer, load_tokenizer, prompt_clean

__version__ = "0.1.0"

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
