"""What a run records besides its arguments and seed to be reproduced: versions and platform."""

from __future__ import annotations

import platform
from typing import Any


def environment() -> dict[str, Any]:
    """Versions and platform: what reproducing a run needs besides its arguments and seed."""
    import jax
    import jaxlib

    from wanjax.version import __version__

    return {
        "wanjax": __version__,
        "jax": jax.__version__,
        "jaxlib": getattr(jaxlib, "__version__", None) or _jaxlib_version(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "backend": jax.default_backend(),
        "devices": [f"{d.platform}:{getattr(d, 'device_kind', '')}" for d in jax.devices()[:1]]
        + ([f"x{jax.device_count()}"] if jax.device_count() > 1 else []),
    }


def _jaxlib_version() -> str | None:
    try:
        from jaxlib import version

        return version.__version__
    except ImportError:  # pragma: no cover
        return None
