"""Prompts as users give them: files of prompts, and negative prompts by name.

diffusers' Wan examples all pass the same negative prompt (the Wan authors' one, in English); it is
offered here by name so nobody has to paste it. The default negative prompt stays ``""``, as in
diffusers' pipelines.
"""

from __future__ import annotations

from pathlib import Path

from wanjax.errors import WanjaxError

OFFICIAL_NEGATIVE_PROMPT = (
    "Bright tones, overexposed, static, blurred details, subtitles, style, works, paintings, images, "
    "static, overall gray, worst quality, low quality, JPEG compression residue, ugly, incomplete, "
    "extra fingers, poorly drawn hands, poorly drawn faces, deformed, disfigured, misshapen limbs, "
    "fused fingers, still picture, messy background, three legs, many people in the background, "
    "walking backwards"
)
NAMED_NEGATIVE_PROMPTS = {"official": OFFICIAL_NEGATIVE_PROMPT}
COMMENT = "#"


def negative_prompt(text: str | None) -> str:
    """The negative prompt ``text`` stands for: a name of :data:`NAMED_NEGATIVE_PROMPTS` gives its
    text, ``None`` gives ``""``, anything else is the prompt itself."""
    if text is None:
        return ""
    return NAMED_NEGATIVE_PROMPTS.get(text, text)


def read_prompt_file(path: str | Path) -> list[str]:
    """The prompts of a text file: one per line; blank lines and lines starting with ``#`` are
    skipped, surrounding spaces stripped. WanjaxError when it cannot be read or holds none."""
    try:
        content = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise WanjaxError(f"{path}: cannot read the prompt file ({e})") from None
    prompts = [line.strip() for line in content.splitlines()]
    prompts = [p for p in prompts if p and not p.startswith(COMMENT)]
    if not prompts:
        raise WanjaxError(f"{path} holds no prompt (one per line; blank and {COMMENT} lines are skipped)")
    return prompts
