"""An Animate run's input files for the end-to-end tests on demo-animate: a character image and pose,
face, background and mask videos of random pixels (and a text file that is not a video)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

FRAMES, FPS = 12, 16.0  # demo-animate's 9-frame segments: two of them


def write_animate_inputs(folder: Path) -> dict[str, Path]:
    """The files, by name: ``image``, ``pose``, ``face``, ``background``, ``mask``, ``text``."""
    from PIL import Image

    from wanjax.io.video import write_mp4

    rng = np.random.default_rng(0)
    paths = {}
    for name, shape in (("pose", (40, 56)), ("face", (24, 24)), ("background", (40, 56)), ("mask", (40, 56))):
        frames = rng.integers(0, 256, (FRAMES, *shape, 3), dtype=np.uint8)
        paths[name] = write_mp4(frames, folder / f"{name}.mp4", fps=FPS)
    paths["image"] = folder / "character.png"
    Image.fromarray(rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)).save(paths["image"])
    paths["text"] = folder / "notes.txt"
    paths["text"].write_text("not a video")
    return paths
