"""The components of a Wan pipeline directory, each described once (:class:`~wanjax.io.component.Component`).

The pre-flight checks, ``wanjax info`` and the demo model read this registry; each model's loader
reads its own entry.
"""

from __future__ import annotations

from wanjax.io.component import Component
from wanjax.models.clip_vision import IMAGE_ENCODER
from wanjax.models.dit import TRANSFORMER, TRANSFORMER_2
from wanjax.models.image_processor import IMAGE_PROCESSOR
from wanjax.models.tokenizer import TOKENIZER
from wanjax.models.umt5 import TEXT_ENCODER
from wanjax.models.vae import VAE

SCHEDULER = Component("scheduler", files=("scheduler_config.json",))

COMPONENTS: dict[str, Component] = {
    c.folder: c
    for c in (
        TOKENIZER,
        TEXT_ENCODER,
        TRANSFORMER,
        TRANSFORMER_2,
        VAE,
        SCHEDULER,
        IMAGE_ENCODER,
        IMAGE_PROCESSOR,
    )
}
IMAGE_COMPONENTS = ("image_encoder", "image_processor")  # what an image-to-video model adds
