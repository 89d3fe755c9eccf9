"""The public component loaders: the model-level ones, taking any name ``WanPipeline.from_pretrained`` takes.

``model``: ``"demo"``, a hub repo id (looked up in the Hugging Face cache at ``revision``, downloaded
first with ``download=True``), a model root or the component's own folder (see
:func:`~wanjax.pipeline.hub.resolve_model`). The other parameters are the model-level loaders'.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax.numpy as jnp
from jax.sharding import Mesh

from wanjax.io.checkpoint import ShardingFn
from wanjax.kernels.attention import AttentionSpec
from wanjax.models import dit, umt5, vae
from wanjax.models import tokenizer as tok
from wanjax.models.dit import WanTransformer
from wanjax.models.tokenizer import Tokenizer
from wanjax.models.umt5 import UMT5Encoder
from wanjax.models.vae import Tiling, WanVAE
from wanjax.pipeline import scheduler as sched
from wanjax.pipeline.hub import resolve_model
from wanjax.pipeline.scheduler import Scheduler, SchedulerConfig


def model_path(model: str | Path, revision: str | None = None, download: bool = False) -> Path:
    """The local directory (or file) that ``model`` names."""
    return resolve_model(model, revision=revision, download=download).path


def load_transformer(
    model: str | Path,
    dtype: str | jnp.dtype = "bfloat16",
    *,
    attention_backend: str | AttentionSpec = "auto",
    sharding: ShardingFn | None = None,
    mesh: Mesh | None = None,
    fsdp: bool = False,
    revision: str | None = None,
    download: bool = False,
) -> WanTransformer:
    """:func:`wanjax.models.dit.load_transformer` for ``model`` (any name ``--model`` takes)."""
    return dit.load_transformer(
        model_path(model, revision, download),
        dtype,
        attention_backend=attention_backend,
        sharding=sharding,
        mesh=mesh,
        fsdp=fsdp,
    )


def load_vae(
    model: str | Path,
    dtype: str | jnp.dtype = "float32",
    weights_dtype: str | jnp.dtype | None = None,
    *,
    decode_chunk: int | str | None = 1,
    encode_chunk: int | str | None = 1,
    frames_per_step: int = 1,
    conv: str = "auto",
    upsample: str = "subpixel",
    tiling: Tiling | None = None,
    sharding: ShardingFn | None = None,
    compile_in_child: bool | None = None,
    revision: str | None = None,
    download: bool = False,
) -> WanVAE:
    """:func:`wanjax.models.vae.load_vae` for ``model`` (any name ``--model`` takes)."""
    return vae.load_vae(
        model_path(model, revision, download),
        dtype,
        weights_dtype,
        decode_chunk=decode_chunk,
        encode_chunk=encode_chunk,
        frames_per_step=frames_per_step,
        conv=conv,
        upsample=upsample,
        tiling=tiling,
        sharding=sharding,
        compile_in_child=compile_in_child,
    )


def load_text_encoder(
    model: str | Path,
    dtype: str | jnp.dtype = "bfloat16",
    *,
    tokenizer: str | Path | Tokenizer | None = None,
    sharding: ShardingFn | None = None,
    trim_padding: bool = True,
    revision: str | None = None,
    download: bool = False,
) -> UMT5Encoder:
    """:func:`wanjax.models.umt5.load_text_encoder` for ``model`` (any name ``--model`` takes)."""
    return umt5.load_text_encoder(
        model_path(model, revision, download),
        dtype,
        tokenizer=tokenizer,
        sharding=sharding,
        trim_padding=trim_padding,
    )


def load_tokenizer(model: str | Path, *, revision: str | None = None, download: bool = False) -> Tokenizer:
    """:func:`wanjax.models.tokenizer.load_tokenizer` for ``model`` (any name ``--model`` takes, or a
    tokenizer.json)."""
    return tok.load_tokenizer(model_path(model, revision, download))


def make_scheduler(
    model: str | Path | dict[str, Any] | SchedulerConfig,
    num_inference_steps: int,
    flow_shift: float | None = None,
    kind: str = "unipc",
    *,
    revision: str | None = None,
    download: bool = False,
) -> Scheduler:
    """:func:`wanjax.pipeline.scheduler.make_scheduler` for ``model`` (any name ``--model`` takes, a
    ``scheduler_config.json``, a dict or a :class:`SchedulerConfig`)."""
    if isinstance(model, str | Path):
        model = model_path(model, revision, download)
    return sched.make_scheduler(model, num_inference_steps, flow_shift, kind)
