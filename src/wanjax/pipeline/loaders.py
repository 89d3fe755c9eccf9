"""The public component loaders: the model-level ones, taking any name ``WanPipeline.from_pretrained`` takes.

``model`` (the first argument): ``"demo"``, a hub repo id (looked up in the Hugging Face cache at
``revision``, downloaded first with ``download=True``), a model root or the component's own folder
(see :func:`~wanjax.pipeline.hub.resolve_model`). Every other argument is the model-level loader's,
passed through unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from wanjax.models import dit, umt5, vae
from wanjax.models import tokenizer as tok
from wanjax.pipeline.hub import resolve_model
from wanjax.sampling import scheduler as sched

T = TypeVar("T")

__all__ = [
    "load_text_encoder",
    "load_tokenizer",
    "load_transformer",
    "load_vae",
    "make_scheduler",
    "model_path",
]


def model_path(model: str | Path, revision: str | None = None, download: bool = False) -> Path:
    """The local directory (or file) that ``model`` names."""
    return resolve_model(model, revision=revision, download=download).path


def by_name(load: Callable[..., T]) -> Callable[..., T]:
    """``load`` with its first argument resolved by :func:`model_path` (strings and paths only: a
    config dict or object passes through), plus keyword-only ``revision`` and ``download``."""

    @functools.wraps(load)
    def load_by_name(
        model: Any, *args: Any, revision: str | None = None, download: bool = False, **kwargs: Any
    ) -> T:
        if isinstance(model, str | Path):
            model = model_path(model, revision, download)
        return load(model, *args, **kwargs)

    load_by_name.__doc__ = f"{load.__doc__}\n\n(``model`` may be any name ``--model`` takes: see {__name__}.)"
    return load_by_name


load_transformer = by_name(dit.load_transformer)
load_vae = by_name(vae.load_vae)
load_text_encoder = by_name(umt5.load_text_encoder)
load_tokenizer = by_name(tok.load_tokenizer)
make_scheduler = by_name(sched.make_scheduler)
