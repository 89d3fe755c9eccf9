"""Stage files of the three-stage workflow (encode -> denoise -> decode) and their checks.

A stage directory holds, with the reference's key names and layouts (so diffusers can read them):

* ``stage1_embeddings.safetensors``: ``prompt_embeds`` and ``negative_prompt_embeds``,
  ``[B, L, text_dim]`` in the text encoder's dtype (bf16 stored natively);
* ``stage1_image.safetensors`` (image-to-video models): ``image_embeds`` (the image encoder's
  states, ``[1 or 2, L, image_dim]``: the first frame, and the last for first-last-frame models; only
  for a transformer that takes them) and
  ``condition_latents`` (``[1, 4 + z, T', H/8, W/8]``: the mask and the VAE latents of the given
  frames), float32, for one video (the denoise stage repeats them over the batch);
* ``stage1_video.safetensors`` (video to video): ``video_latents``, float32 ``[1, z, T', H/8, W/8]``,
  the source video's normalised latents (the denoise stage noises them to its strength);
* ``stage1_vace.safetensors`` (a VACE model): ``control_latents``, float32 ``[1, 96, T' + R, H/8, W/8]``
  (the control video's encodings, its folded mask, ``R`` reference images' latent frames first) and
  ``control_scale`` (one per vace layer); the config's ``reference_frames`` is ``R`` (the decode drops them);
* ``stage1_animate.safetensors`` (an Animate model): what no segment changes
  (:class:`~wanjax.pipeline.animate.AnimateConditioning`): the prepared ``pose_video``,
  ``face_video`` (and replace mode's ``background_video``, ``mask_video``) frames, channels first,
  over the frames the segments cover, as the uint8 pixels they were made from (a quarter of the
  float32 values' bytes; read back to the same bits); the character's ``image_embeds``; ``reference_latents``
  ``[1, 4 + z, 1, H/8, W/8]``; ``segments`` (int64: the pose video's frames, a segment's frames,
  the frames each repeats);
* ``stage2_latents.safetensors``: ``latents``, float32 ``[B, 16, T', H/8, W/8]``, the transformer's
  normalised latents (diffusers' ``output_type="latent"``); an Animate model's: every segment's
  latents (the reference's latent frame first in each) one after the other in time, and its
  ``segments``, which the decode splits them by;
* ``generation_config.json``: every parameter (latest values, flat), the model and the wanjax
  version, plus under ``stages`` what each stage was given. Re-running a stage drops the entries of
  the stages after it.

Every file is written atomically. A later stage checks its video flags against what the earlier
stages fixed (:func:`check_video_flags`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save

from wanjax.errors import NumericalError, WanjaxError
from wanjax.io.atomic import atomic_path, write_text
from wanjax.io.checkpoint import open_safetensors
from wanjax.models.dit import VaceControl
from wanjax.pipeline.animate import (
    VIDEO_INPUTS,
    AnimateConditioning,
    AnimateVideos,
    Segments,
    mask_pixels,
    mask_values,
)
from wanjax.pipeline.conditioning import signed_pixels, uint8_pixels
from wanjax.sampling.guidance import ImageConditioning

EMBEDDINGS_FILE = "stage1_embeddings.safetensors"
IMAGE_FILE = "stage1_image.safetensors"
VIDEO_FILE = "stage1_video.safetensors"
VACE_FILE = "stage1_vace.safetensors"
ANIMATE_FILE = "stage1_animate.safetensors"
LATENTS_FILE = "stage2_latents.safetensors"
CONFIG_FILE = "generation_config.json"
STAGES = ("encode", "denoise", "decode")
VIDEO_KEYS = ("height", "width", "frames", "fps")
_UNFLATTENED = ("arguments", "environment", "written")  # per-stage records, not parameters
_PRODUCED_BY = {
    EMBEDDINGS_FILE: "encode --output_dir",
    IMAGE_FILE: "encode --image IMAGE --output_dir",
    VIDEO_FILE: "encode --video VIDEO --output_dir",
    VACE_FILE: "encode --model VACE_MODEL --output_dir",
    ANIMATE_FILE: "encode --model ANIMATE_MODEL --image IMAGE --pose_video POSE --face_video FACE --output_dir",
    LATENTS_FILE: "denoise --input_dir",
}


def _save(path: Path, tensors: Mapping[str, np.ndarray]) -> Path:
    """Serialised in memory (stage tensors are small) and written through :func:`atomic_path`, so the
    file gets the umask's mode as every other output (safetensors' own writer makes it 0600)."""
    data = save({k: np.ascontiguousarray(v) for k, v in tensors.items()}, metadata={"format": "pt"})
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return path


def _read(path: Path, keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The named tensors of a safetensors file (WanjaxError naming the problem otherwise)."""
    if not path.is_file():
        producer = _PRODUCED_BY.get(path.name)
        hint = f"; run `wanjax {producer} {path.parent}` first" if producer else ""
        raise WanjaxError(f"{path}: file not found{hint}")
    refs = open_safetensors(path)
    missing = [k for k in keys if k not in refs]
    if missing:
        raise WanjaxError(f"{path}: no tensor {', '.join(missing)} (has {', '.join(sorted(refs)) or 'none'})")
    return {k: refs[k].array() for k in keys}


def check_finite(path: Path, name: str, array: np.ndarray) -> None:
    """NumericalError when a stage tensor holds NaN or inf (a diverged earlier run)."""
    if np.issubdtype(array.dtype, np.integer):
        return
    finite = np.isfinite(array.astype(np.float32, copy=False))
    if not finite.all():
        bad = int(finite.size - np.count_nonzero(finite))
        raise NumericalError(
            f"{path}: {name} holds {bad} NaN/inf value(s) of {finite.size}; the run that wrote it diverged "
            "(re-run it, e.g. with --dtype float32)"
        )


def save_embeddings(directory: str | Path, prompt_embeds: Any, negative_prompt_embeds: Any) -> Path:
    """Write ``stage1_embeddings.safetensors`` (dtype kept as is, bf16 included)."""
    tensors = {
        "prompt_embeds": np.asarray(prompt_embeds),
        "negative_prompt_embeds": np.asarray(negative_prompt_embeds),
    }
    return _save(Path(directory) / EMBEDDINGS_FILE, tensors)


def load_embeddings(directory: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """``(prompt_embeds, negative_prompt_embeds)`` of a stage directory, checked to be ``[B, L, D]`` alike."""
    path = Path(directory) / EMBEDDINGS_FILE
    t = _read(path, ("prompt_embeds", "negative_prompt_embeds"))
    pos, neg = t["prompt_embeds"], t["negative_prompt_embeds"]
    if pos.ndim != 3 or pos.shape != neg.shape:
        raise WanjaxError(
            f"{path}: prompt_embeds {pos.shape} and negative_prompt_embeds {neg.shape} must both be [B, L, D]"
        )
    for name, array in (("prompt_embeds", pos), ("negative_prompt_embeds", neg)):
        check_finite(path, name, array)
    return pos, neg


def save_image_conditioning(directory: str | Path, conditioning: ImageConditioning | None) -> Path:
    """Write ``stage1_image.safetensors`` (``conditioning`` of one video); with None, remove a stale
    one (an earlier run's), so the directory holds no image it was not given."""
    path = Path(directory) / IMAGE_FILE
    if conditioning is None:
        path.unlink(missing_ok=True)
        return path
    tensors = {"condition_latents": np.asarray(conditioning.latents, np.float32)}
    if conditioning.image_embeds is not None:
        tensors["image_embeds"] = np.asarray(conditioning.image_embeds, np.float32)
    return _save(path, tensors)


def load_image_conditioning(directory: str | Path) -> ImageConditioning:
    """The image conditioning of a stage directory (one video), checked to be ``[n, L, D]`` states and
    ``[1, C, T', h, w]`` latents, finite."""
    path = Path(directory) / IMAGE_FILE
    latents = _read(path, ("condition_latents",))["condition_latents"]
    embeds = (
        _read(path, ("image_embeds",))["image_embeds"] if "image_embeds" in open_safetensors(path) else None
    )
    if (embeds is not None and embeds.ndim != 3) or latents.ndim != 5 or latents.shape[0] != 1:
        shape = None if embeds is None else embeds.shape
        raise WanjaxError(
            f"{path}: image_embeds {shape} must be [n, L, D] and condition_latents {latents.shape} "
            "[1, C, T', h, w]"
        )
    check_finite(path, "condition_latents", latents)
    if embeds is not None:
        check_finite(path, "image_embeds", embeds)
        embeds = embeds.astype(np.float32)
    return ImageConditioning(latents.astype(np.float32), embeds)


def save_video_latents(directory: str | Path, latents: Any | None) -> Path:
    """Write ``stage1_video.safetensors`` (a source video's latents); with None, remove a stale one."""
    path = Path(directory) / VIDEO_FILE
    if latents is None:
        path.unlink(missing_ok=True)
        return path
    return _save(path, {"video_latents": np.asarray(latents, np.float32)})


def load_video_latents(directory: str | Path) -> np.ndarray | None:
    """A stage directory's source video latents (``[1, z, T', h, w]``, finite), None when it has none."""
    path = Path(directory) / VIDEO_FILE
    if not path.exists():
        return None
    latents = _read(path, ("video_latents",))["video_latents"]
    if latents.ndim != 5 or latents.shape[0] != 1:
        raise WanjaxError(f"{path}: video_latents {latents.shape} must be [1, C, T', h, w]")
    check_finite(path, "video_latents", latents)
    return latents.astype(np.float32)


def save_vace(directory: str | Path, control: VaceControl | None) -> Path:
    """Write ``stage1_vace.safetensors`` (a VACE model's control); with None, remove a stale one."""
    path = Path(directory) / VACE_FILE
    if control is None:
        path.unlink(missing_ok=True)
        return path
    tensors = {"control_latents": np.asarray(control.latents, np.float32)}
    return _save(path, {**tensors, "control_scale": np.asarray(control.scale, np.float32)})


def load_vace(directory: str | Path) -> VaceControl | None:
    """A stage directory's VACE control (``[1, C, T, h, w]`` latents and their scales, finite), None
    when it has none."""
    path = Path(directory) / VACE_FILE
    if not path.exists():
        return None
    found = _read(path, ("control_latents", "control_scale"))
    latents, scale = found["control_latents"], found["control_scale"]
    if latents.ndim != 5 or latents.shape[0] != 1 or scale.ndim != 1:
        raise WanjaxError(
            f"{path}: control_latents {latents.shape} must be [1, C, T', h, w], control_scale [n]"
        )
    for name, array in found.items():
        check_finite(path, name, array)
    return VaceControl(latents.astype(np.float32), scale.astype(np.float32))


_SIGNED = (uint8_pixels, signed_pixels)  # float32 -> the uint8 pixels stored, and back, bit for bit
_PIXELS = {**dict.fromkeys(VIDEO_INPUTS[:3], _SIGNED), "mask_video": (mask_pixels, mask_values)}


def _segments_tensor(segments: Segments) -> np.ndarray:
    return np.asarray([segments.frames, segments.length, segments.overlap], np.int64)


def _segments_of(path: Path, array: np.ndarray) -> Segments:
    if array.shape != (3,) or not np.issubdtype(array.dtype, np.integer) or (array <= 0).any():
        raise WanjaxError(
            f"{path}: segments {array.tolist()} must be 3 positive integers; re-run `wanjax encode`"
        )
    frames, length, overlap = (int(v) for v in array)
    return Segments(frames, length, overlap)


def save_animate(directory: str | Path, conditioning: AnimateConditioning | None) -> Path:
    """Write ``stage1_animate.safetensors`` (an Animate model's inputs); with None, remove a stale one."""
    path = Path(directory) / ANIMATE_FILE
    if conditioning is None:
        path.unlink(missing_ok=True)
        return path
    v = conditioning.videos
    videos = dict(zip(VIDEO_INPUTS, (v.pose, v.face, v.background, v.mask), strict=True))
    tensors = {k: _PIXELS[k][0](a) for k, a in videos.items() if a is not None}
    tensors["image_embeds"] = np.asarray(conditioning.image_embeds)  # its dtype kept, bf16 included
    tensors["reference_latents"] = np.asarray(conditioning.reference, np.float32)
    return _save(path, {**tensors, "segments": _segments_tensor(v.segments)})


def load_animate(directory: str | Path) -> AnimateConditioning | None:
    """A stage directory's Animate inputs (checked: shapes that fit together, finite), None when it
    has none."""
    path = Path(directory) / ANIMATE_FILE
    if not path.exists():
        return None
    held = set(open_safetensors(path))
    given = tuple(k for k in VIDEO_INPUTS if k in held)
    found = _read(
        path, ("pose_video", "face_video", "image_embeds", "reference_latents", "segments", *given[2:])
    )
    segments = _segments_of(path, found["segments"])
    pose, face = found["pose_video"], found["face_video"]
    reference, embeds = found["reference_latents"], found["image_embeds"]
    frames = segments.covered
    fits = (
        pose.ndim == 4 and pose.shape[:2] == (3, frames) and face.ndim == 4 and face.shape[:2] == (3, frames)
    )
    fits = fits and reference.ndim == 5 and reference.shape[0] == 1 and embeds.ndim == 3
    fits = fits and all(found[k].shape[1:] == (frames, *pose.shape[2:]) for k in given[2:])
    if not fits or len(given) == 3:
        raise WanjaxError(
            f"{path}: its videos, reference_latents {reference.shape} and image_embeds {embeds.shape} do not fit "
            f"{frames} frames; re-run `wanjax encode`"
        )
    for name, array in found.items():
        check_finite(path, name, array)
    if any(found[k].dtype != np.uint8 for k in given):
        raise WanjaxError(f"{path}: its videos must be uint8 pixels; re-run `wanjax encode`")
    f32 = {k: _PIXELS[k][1](found[k]) for k in given}
    videos = AnimateVideos(
        segments, f32["pose_video"], f32["face_video"], f32.get("background_video"), f32.get("mask_video")
    )
    return AnimateConditioning(videos, embeds, reference.astype(np.float32))


def save_segment_latents(path: str | Path, latents: list[Any], segments: Segments) -> Path:
    """Write an Animate run's segments' latents (each ``[B, z, T' + 1, h, w]``) one after the other in
    time, with the ``segments`` they are split by."""
    joined = np.concatenate([np.asarray(x, np.float32) for x in latents], axis=2)
    return _save(Path(path), {"latents": joined, "segments": _segments_tensor(segments)})


def load_segments(path: str | Path, latents: np.ndarray) -> tuple[Segments, list[np.ndarray]] | None:
    """An Animate run's latents file (:func:`save_segment_latents`): its segments and each one's
    latents; None for one video's latents."""
    path = Path(path)
    if "segments" not in open_safetensors(path):
        return None
    segments = _segments_of(path, _read(path, ("segments",))["segments"])
    if latents.shape[2] % segments.count:
        raise WanjaxError(
            f"{path}: latents {list(latents.shape)} do not split into {segments.count} segments; re-run "
            "`wanjax denoise`"
        )
    return segments, np.split(latents, segments.count, axis=2)


def save_latents(path: str | Path, latents: Any) -> Path:
    """Write ``latents`` (float32 ``[B, z, T', h, w]``) to a safetensors file."""
    return _save(Path(path), {"latents": np.asarray(latents, np.float32)})


def load_latents(path: str | Path) -> np.ndarray:
    """The float32 ``latents [B, z, T', h, w]`` of a safetensors file (stage 2 or ``--init_latents``)."""
    path = Path(path)
    latents = _read(path, ("latents",))["latents"]
    if latents.ndim != 5 or not np.issubdtype(latents.dtype, np.floating):
        raise WanjaxError(
            f"{path}: latents must be a float [B, C, T', H/8, W/8] tensor, got {latents.dtype} {latents.shape}"
        )
    check_finite(path, "latents", latents)
    return latents.astype(np.float32)


def read_config(directory: str | Path) -> dict[str, Any]:
    """The directory's ``generation_config.json`` (``{}`` when there is none)."""
    path = Path(directory) / CONFIG_FILE
    if not path.exists():
        return {}
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise WanjaxError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except (UnicodeDecodeError, RecursionError):
        raise WanjaxError(f"{path}: not valid JSON (not UTF-8 text, or nested too deeply)") from None
    except OSError as e:
        raise WanjaxError(f"{path}: cannot read ({e.strerror or e})") from None
    if not isinstance(config, dict):
        raise WanjaxError(f"{path}: expected a JSON object")
    stages = config.get("stages", {})
    if not isinstance(stages, dict) or not all(isinstance(v, dict) for v in stages.values()):
        raise WanjaxError(f"{path}: 'stages' must map stage names to objects; start a new stage directory")
    return config


def record_stage(config: Mapping[str, Any], stage: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with ``params`` as ``stage``'s entry; later stages' entries dropped (they are stale
    now) and the flat fields rebuilt from the stages in order."""
    from wanjax.version import __version__

    order = STAGES.index(stage)
    stages = {k: v for k, v in config.get("stages", {}).items() if k in STAGES and STAGES.index(k) < order}
    stages[stage] = dict(params)
    flat: dict[str, Any] = {}
    for name in STAGES:
        flat.update({k: v for k, v in stages.get(name, {}).items() if k not in _UNFLATTENED})
    return {**flat, "wanjax_version": __version__, "stages": stages}


def write_config(directory: str | Path, config: Mapping[str, Any]) -> Path:
    return write_text(Path(directory) / CONFIG_FILE, json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def upstream(config: Mapping[str, Any], stage: str) -> dict[str, tuple[Any, str]]:
    """Values recorded by the stages before ``stage``: key -> (value, the stage that set it)."""
    found: dict[str, tuple[Any, str]] = {}
    for name in STAGES[: STAGES.index(stage)]:
        for key, value in config.get("stages", {}).get(name, {}).items():
            if value is not None and key not in _UNFLATTENED:
                found[key] = (value, name)
    return found


def check_video_flags(
    config: Mapping[str, Any], stage: str, given: Mapping[str, Any], where: str | Path
) -> None:
    """Raise WanjaxError when a video flag given to ``stage`` contradicts an earlier stage's value."""
    earlier = upstream(config, stage)
    for key in VIDEO_KEYS:
        value = given.get(key)
        if value is None or key not in earlier or earlier[key][0] == value:
            continue
        recorded, by = earlier[key]
        raise WanjaxError(
            f"--{key} {value} contradicts {Path(where) / CONFIG_FILE} ({key} {recorded} from `wanjax {by}`); "
            f"leave --{key} out or start a new stage directory"
        )
