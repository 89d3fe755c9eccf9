"""``model_index.json``: which pipeline a diffusers model directory is, and what wanjax acts on in it.

Every entry must be one wanjax acts on: a component it loads (:data:`COMPONENT_ENTRIES`, an entry
``[null, null]`` meaning "absent", as diffusers writes optional components), or a pipeline option it
runs (Wan 2.2 A14B's ``transformer_2`` and ``boundary_ratio``: the two experts; TI2V-5B's
``expand_timesteps``). Anything else is an error naming it, not an entry silently skipped: a model
run with part of its pipeline would exit 0 with degraded videos. A directory without ``model_index.json`` (a hand-assembled one) is read by its folders.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

from wanjax.errors import ConfigError
from wanjax.io.component import read_config_file
from wanjax.models.config import ComponentConfig
from wanjax.models.registry import DMD_PIPELINE_CLASS

INDEX_FILE = "model_index.json"
PIPELINE_CLASSES = (
    "WanPipeline",
    "WanImageToVideoPipeline",
    "WanVACEPipeline",
    "WanAnimatePipeline",
    DMD_PIPELINE_CLASS,
)
COMPONENT_ENTRIES = (
    "tokenizer",
    "text_encoder",
    "transformer",
    "vae",
    "scheduler",
    "image_encoder",
    "image_processor",
)
NOT_YET = "not supported yet by wanjax (it would run a different model than the checkpoint's)"

Entry = tuple[Any, ...] | None


@dataclasses.dataclass(frozen=True)
class ModelIndex(ComponentConfig):
    """The fields of a Wan pipeline's ``model_index.json`` (``_class_name`` and other ``_`` keys are
    kept in ``metadata``); unknown fields are rejected (:class:`ComponentConfig`)."""

    tokenizer: Entry = None
    text_encoder: Entry = None
    transformer: Entry = None
    vae: Entry = None
    scheduler: Entry = None
    image_encoder: Entry = None
    image_processor: Entry = None
    # Wan 2.2 A14B: the low-noise expert, and the switch to it (pipeline.WanPipeline.boundary_ratio)
    transformer_2: Entry = None
    boundary_ratio: float | None = None
    expand_timesteps: bool = False  # Wan 2.2 TI2V-5B: an image's latents as the first latent frame

    _IGNORED_FIELDS: ClassVar[frozenset[str]] = frozenset()

    @property
    def pipeline_class(self) -> str | None:
        return self.metadata.get("_class_name")

    @property
    def dmd(self) -> bool:
        """A FastWan checkpoint (FastVideo's ``WanDMDPipeline``): run by its DMD sampler, not its
        scheduler config's."""
        return self.pipeline_class == DMD_PIPELINE_CLASS

    def present(self, name: str) -> bool:
        """Whether component ``name`` is part of the pipeline (an entry other than ``[null, null]``)."""
        entry = getattr(self, name)
        return entry is not None and any(v is not None for v in entry)

    def validate(self, source: str) -> None:
        cls = self.pipeline_class
        if cls is not None and cls not in PIPELINE_CLASSES:
            raise ConfigError(f"{source}: a {cls}; wanjax runs {', '.join(PIPELINE_CLASSES)} models")
        for name in (*COMPONENT_ENTRIES, "transformer_2"):
            entry = getattr(self, name)
            if entry is not None and (not isinstance(entry, tuple) or len(entry) != 2):
                raise ConfigError(f"{source}: {name} must be a [library, class] pair, got {entry!r}")
        if self.present("transformer_2") != (self.boundary_ratio is not None):
            raise ConfigError(
                f"{source}: a two-expert (Wan 2.2 A14B) model needs both transformer_2 and boundary_ratio "
                f"(got {self.transformer_2} and {self.boundary_ratio})"
            )
        if self.boundary_ratio is not None and not 0 < self.boundary_ratio < 1:
            raise ConfigError(f"{source}: boundary_ratio must be between 0 and 1, got {self.boundary_ratio}")
        if self.present("transformer_2") and not self.present("transformer"):
            raise ConfigError(f"{source}: transformer_2 without transformer (the high-noise expert)")
        if self.expand_timesteps and self.boundary_ratio is not None:
            raise ConfigError(f"{source}: expand_timesteps with two experts is {NOT_YET}")


def read_model_index(root: str | Path) -> ModelIndex | None:
    """The ``model_index.json`` of a model root, checked (ConfigError naming an entry wanjax does
    not act on); None when the directory has none."""
    path = Path(root) / INDEX_FILE
    if not path.is_file():
        return None
    return read_config_file(ModelIndex, path)
