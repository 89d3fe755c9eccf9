"""Which components are in device memory while each stage runs (the ``offload`` setting).

Under ``"none"`` every component stays on the device once loaded. Under ``"model"`` and ``"blocks"``
only the running stage's component is: before a stage, the other stages' components go to pinned host
memory (waiting until their device copies are free, so the device never holds two), then this stage's
comes back (asynchronously: the move overlaps what runs before the first program that reads it). A
two-expert model's experts take turns the same way: the second waits on the host until its first
step. ``WanPipeline`` and ``wanjax bench`` both move weights through a :class:`Residency`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from wanjax.models.offload import Offload, take_turns

STAGES = ("encode", "denoise", "decode")


@dataclasses.dataclass(frozen=True)
class Loaded:
    """The components loaded so far (None: not yet), each with ``to_host`` and ``to_device``."""

    encoders: Sequence[Any] = ()  # the text encoder and an image encoder
    transformer: Any = None
    transformer_2: Any = None  # a two-expert model's low-noise expert


@dataclasses.dataclass(frozen=True)
class Residency:
    """Moves weights between device and host memory as ``offload`` says."""

    offload: Offload = "none"

    @property
    def moves(self) -> bool:
        return self.offload != "none"

    def enter(self, stage: str, loaded: Loaded) -> None:
        """Before ``stage`` runs: the other stages' components to the host, then this stage's back (a
        second expert stays on the host until its first step)."""
        if not self.moves:
            return
        if stage != "encode":
            for encoder in loaded.encoders:
                encoder.to_host(block=True)
        for model in (loaded.transformer, loaded.transformer_2):
            if model is not None and (stage != "denoise" or model is loaded.transformer_2):
                model.to_host(block=True)
        if stage == "encode":
            for encoder in loaded.encoders:
                encoder.to_device()
        if stage == "denoise" and loaded.transformer is not None:
            loaded.transformer.to_device()

    def park(self, model: Any) -> None:
        """A component loaded ahead of its turn (a second expert) waits on the host."""
        if self.moves:
            model.to_host(block=True)

    def switch_expert(self, experts: Sequence[Any], active: int, *, block: bool = False) -> None:
        """Before expert ``active``'s first step: the other expert to the host, this one to the device."""
        if self.moves and len(experts) > 1:
            take_turns(experts, active, block=block)
