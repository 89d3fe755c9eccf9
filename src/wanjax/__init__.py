"""wanjax: a JAX-native inference engine for Wan 2.1 text-to-video."""

from wanjax.config import TransformerConfig
from wanjax.errors import CheckpointError, ConfigError, WanjaxError
from wanjax.models.dit import WanTransformer, load_transformer
from wanjax.scheduler import SchedulerConfig, make_scheduler

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "ConfigError",
    "SchedulerConfig",
    "TransformerConfig",
    "WanTransformer",
    "WanjaxError",
    "__version__",
    "load_transformer",
    "make_scheduler",
]
