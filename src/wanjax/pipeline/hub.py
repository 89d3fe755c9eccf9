"""Where models come from: a local directory, the built-in ``demo``, or the local Hugging Face cache.

Nothing is downloaded. A hub repo id (``Wan-AI/Wan2.1-T2V-1.3B-Diffusers``) is looked up in the
Hugging Face cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``) at
the snapshot ``refs/main`` points to; when it is absent the error says how to download it.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from wanjax.errors import WanjaxError
from wanjax.io.paths import cache_root, hf_hub_cache

DEMO = "demo"
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """A resolved ``--model``: what the user named and the directory that holds it."""

    name: str
    path: Path
    is_demo: bool = False


def find_in_hf_cache(repo_id: str, cache: Path | None = None) -> Path | None:
    """The snapshot directory of ``repo_id`` in the HF cache (``refs/main``, else the newest one)."""
    repo = (cache or hf_hub_cache()) / ("models--" + repo_id.replace("/", "--"))
    snapshots = repo / "snapshots"
    ref = repo / "refs" / "main"
    if ref.is_file():
        snapshot = snapshots / ref.read_text().strip()
        if snapshot.is_dir():
            return snapshot
    candidates = sorted(snapshots.glob("*"), key=lambda p: p.stat().st_mtime) if snapshots.is_dir() else []
    return candidates[-1] if candidates else None


def resolve_model(model: str | Path) -> ModelSource:
    """``demo`` -> the built-in model (generated on first use; a local folder named demo is ``./demo``);
    an existing path -> itself; a repo id -> its snapshot in the local Hugging Face cache. Raises
    WanjaxError naming the fix otherwise."""
    name = str(model)
    if name == DEMO:
        from wanjax.pipeline.demo import demo_model_dir

        return ModelSource(name, demo_model_dir(cache_root()), is_demo=True)
    path = Path(name).expanduser()
    if path.exists():
        from wanjax.pipeline.demo import is_demo_model

        return ModelSource(name, path, is_demo=is_demo_model(path))
    if _REPO_ID.match(name):
        snapshot = find_in_hf_cache(name)
        if snapshot is not None:
            return ModelSource(name, snapshot)
        raise WanjaxError(
            f"{name}: not a local directory and not in the Hugging Face cache ({hf_hub_cache()}); download "
            f"it with `pip install huggingface_hub && hf download {name}`, pass a local diffusers "
            "directory, or try --model demo"
        )
    raise WanjaxError(
        f"{name}: model path does not exist (pass a diffusers model directory, a hub id or demo)"
    )
