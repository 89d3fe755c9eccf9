"""Where models come from: a local directory, the built-in ``demo``, or the local Hugging Face cache.

Nothing is downloaded. A hub repo id (``Wan-AI/Wan2.1-T2V-1.3B-Diffusers``) is looked up in the
Hugging Face cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``) at
the snapshot ``refs/main`` points to; when it is absent the error says how to download it.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """wanjax's cache folder: ``$WANJAX_CACHE``, else ``$XDG_CACHE_HOME/wanjax``, else ``~/.cache/wanjax``."""
    if os.environ.get("WANJAX_CACHE"):
        return Path(os.environ["WANJAX_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "wanjax"


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache directory, as ``huggingface_hub`` resolves it."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = (
        os.environ.get("HF_HOME")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    )
    return Path(home).expanduser() / "hub"
