"""Where models come from: a local directory, the built-in ``demo``, or the Hugging Face hub cache.

A hub repo id (``Wan-AI/Wan2.1-T2V-1.3B-Diffusers``) is looked up with ``huggingface_hub`` in its
cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``), at ``revision`` (a branch, tag or commit; default
``main``). Nothing is downloaded unless asked (``download=True``); then only the files a diffusers Wan
pipeline reads are fetched (configs, safetensors, tokenizer files), never pickles.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import huggingface_hub
from huggingface_hub import constants
from huggingface_hub.errors import (
    HFValidationError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import validate_repo_id

from wanjax.errors import CheckpointError, WanjaxError
from wanjax.io.paths import cache_root

# What a diffusers Wan pipeline reads: configs and indexes, safetensors weights, tokenizer files.
PIPELINE_FILES = ("*.json", "*.safetensors", "*.txt", "*.model")


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """A resolved ``--model``: what the user named and the directory that holds it."""

    name: str
    path: Path
    is_demo: bool = False


def is_repo_id(name: str) -> bool:
    """Whether ``name`` has the form of a hub model id, ``namespace/name``."""
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return "/" in name


def hub_snapshot(repo_id: str, revision: str | None = None, download: bool = False) -> Path:
    """The local snapshot of ``repo_id`` at ``revision``: from the HF cache, else (``download``) fetched."""
    label = repo_id if revision is None else f"{repo_id} (revision {revision})"
    fetch = f"hf download {repo_id}" + (f" --revision {revision}" if revision else "")
    try:
        return _snapshot(repo_id, revision, local_files_only=True)
    except LocalEntryNotFoundError:
        if not download:
            raise WanjaxError(
                f"{label}: not a local directory and not in the Hugging Face cache "
                f"({constants.HF_HUB_CACHE}); fetch it with `{fetch}` or --download "
                "(download=True), pass a local diffusers directory, or try --model demo"
            ) from None
    if constants.HF_HUB_OFFLINE:
        raise WanjaxError(
            f"{label}: not in the Hugging Face cache and HF_HUB_OFFLINE is set; unset it to download, "
            f"or run `{fetch}` where there is network access"
        )
    try:
        return _snapshot(repo_id, revision, local_files_only=False)
    except RevisionNotFoundError:
        raise WanjaxError(f"{label}: no such branch, tag or commit on the hub") from None
    except RepositoryNotFoundError:
        raise WanjaxError(
            f"{repo_id}: no such model on the hub, or it is private or gated (log in with "
            "`hf auth login` or set HF_TOKEN)"
        ) from None
    except Exception as e:  # whatever else stopped the download: the network, the disk
        cause = e.__cause__ or e  # huggingface_hub wraps connection errors
        reason = str(cause).strip().partition("\n")[0]
        raise WanjaxError(
            f"{label}: download failed ({type(cause).__name__}: {reason}); check the network, or run "
            f"`{fetch}` where there is network access"
        ) from None


def _snapshot(repo_id: str, revision: str | None, *, local_files_only: bool) -> Path:
    return Path(
        huggingface_hub.snapshot_download(
            repo_id, revision=revision, local_files_only=local_files_only, allow_patterns=list(PIPELINE_FILES)
        )
    )


def resolve_model(model: str | Path, *, revision: str | None = None, download: bool = False) -> ModelSource:
    """``demo`` (or another built-in variant, ``demo-i2v``) -> the built-in model (generated on first
    use; a local folder named demo is ``./demo``);
    an existing path -> itself; a hub repo id -> its snapshot at ``revision`` in the Hugging Face cache,
    downloaded first with ``download=True``. Raises WanjaxError naming the fix otherwise."""
    name = str(model)
    path = Path(name).expanduser()
    from wanjax.pipeline.demo import demo_variants

    if revision is not None and (name in demo_variants() or path.exists()):
        raise WanjaxError(f"{name}: a revision applies only to hub repo ids; drop it for a local model")
    if name in demo_variants():
        from wanjax.pipeline.demo import demo_model_dir

        return ModelSource(name, demo_model_dir(cache_root(), name), is_demo=True)
    if path.exists():
        from wanjax.pipeline.demo import is_demo_model

        return ModelSource(name, path, is_demo=is_demo_model(path))
    if is_repo_id(name):
        return ModelSource(name, hub_snapshot(name, revision, download))
    raise CheckpointError(
        f"{name}: model path does not exist (pass a diffusers model directory, a hub id or demo)"
    )
