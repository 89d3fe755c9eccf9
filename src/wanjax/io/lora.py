"""Wan transformer LoRA files (safetensors) read as per-module weight updates, as diffusers loads them.

The layouts are those ``WanLoraLoaderMixin.lora_state_dict`` / ``load_lora_weights`` accept
(diffusers 0.42), detected the same way, in this order (:attr:`LoraFile.format`):

- ``wan-original`` (any key starts with ``diffusion_model.``): original Wan module names,
  ``diffusion_model.blocks.0.self_attn.q.{lora_down,lora_up}.weight`` (or ``lora_A``/``lora_B``),
  optional ``.alpha``. Converted as ``_convert_non_diffusers_wan_lora_to_diffusers`` does.
- ``lightx2v``: the same layout with ``.diff`` / ``.diff_b`` / ``.diff_m`` keys. ``diff_b`` (a bias
  delta) is kept, as diffusers keeps it (PEFT ``lora_B.bias``). Of the full ``.diff`` deltas diffusers
  applies only ``head.head.diff`` (as ``proj_out``'s ``lora_A`` under an identity ``lora_B``, replacing
  any ``head.head`` LoRA); the others (norms, modulation, projections) are dropped, and so are they here
  (listed in :attr:`LoraFile.ignored`).
- ``musubi`` (any key starts with ``lora_unet_``): musubi-tuner's
  ``lora_unet_blocks_0_self_attn_q.{lora_down.weight,lora_up.weight,alpha}``; as in diffusers every block
  must hold all its attention and FFN projections, each with an alpha.
- ``peft-wan`` (any key starts with ``base_model.model.``): PEFT's ``save_pretrained`` of the original
  Wan model (``adapter_model.safetensors``, its ``LoraConfig`` in ``adapter_config.json`` beside it),
  ``base_model.model.blocks.0.self_attn.q.lora_A.weight``, as Wan 2.2 Animate's ``relighting_lora/``
  (every Linear of the blocks, the face adapters left out). diffusers 0.42 loads no such keys; the
  names are converted as ``wan-original``'s, the scale is the config's ``lora_alpha / r`` (1 without
  a config).
- ``diffusers``: PEFT keys ``transformer.blocks.0.attn1.to_q.lora_A.weight`` / ``lora_B.weight``
  (``lora_B.bias``), with PEFT's ``LoraConfig`` in the header's ``lora_adapter_metadata`` when diffusers
  wrote the file. Keys of other components (``text_encoder.``...) are ignored, as Wan's
  ``load_lora_weights`` loads only the transformer. Files written by ``save_lora_adapter`` (no
  ``transformer.`` prefix, as loaded by ``load_lora_adapter(..., prefix=None)``) are read too.

Alpha: for the non-diffusers layouts diffusers folds ``alpha / rank`` into the factors
(``lora_A * s_down``, ``lora_B * s_up`` with ``s_down * s_up = alpha / rank``, ``s_up`` a power of two,
each product rounded to the file's dtype) and PEFT then runs with ``lora_alpha == r`` (scale 1); this
module folds identically. Without metadata a diffusers file also gets scale 1. With metadata the scale
is PEFT's ``lora_alpha / r`` (``/ sqrt(r)`` with ``use_rslora``), per module through ``rank_pattern`` /
``alpha_pattern``. The scale multiplies both ``lora_B @ lora_A`` and the bias delta, as PEFT's merge does.

Refused: pickle files, DoRA (``lora_magnitude_vector``: its update depends on the base weight), LoKr,
and every key layout diffusers would reject. kohya's ``dora_scale`` keys are dropped with a warning, as
diffusers does.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
import warnings
from pathlib import Path

import numpy as np

from wanjax.errors import CheckpointError, parse_json_object
from wanjax.io.checkpoint import _PICKLE_SUFFIXES, open_safetensors

LORA_WEIGHT_NAME = "pytorch_lora_weights.safetensors"  # what diffusers looks for in a directory
PEFT_WEIGHT_NAME = "adapter_model.safetensors"  # PEFT's save_pretrained: the weights ...
PEFT_CONFIG_NAME = "adapter_config.json"  # ... and their LoraConfig
_PEFT_PREFIX = "base_model.model."
_METADATA_KEY = "lora_adapter_metadata"

# The Linear layers of diffusers' WanTransformer3DModel that a LoRA may target.
_MODULE = re.compile(
    r"(vace_)?blocks\.\d+\.(attn1\.(to_q|to_k|to_v|to_out\.0)|attn2\.(to_q|to_k|to_v|to_out\.0|add_k_proj|add_v_proj)"
    r"|ffn\.net\.(0\.proj|2)|proj_in|proj_out)"  # vace_blocks: a VACE model's control blocks
    r"|condition_embedder\.((time|text)_embedder\.linear_[12]|time_proj|image_embedder\.ff\.net\.(0\.proj|2))"
    r"|proj_out"
    r"|face_adapter\.\d+\.(to_q|to_k|to_v|to_out)"  # an Animate model's face adapters
)
_PARTS = ("lora_A.weight", "lora_B.weight", "lora_B.bias", "diff")  # "diff": head.head.diff (see above)

# Original Wan names -> diffusers names, per block (the loops of the two diffusers converters).
_ATTN = (("q", "to_q"), ("k", "to_k"), ("v", "to_v"), ("o", "to_out.0"))
_BLOCK = (
    *((f"self_attn.{o}", f"attn1.{c}") for o, c in _ATTN),
    *((f"cross_attn.{o}", f"attn2.{c}") for o, c in _ATTN),
)
_BLOCK_I2V = (("cross_attn.k_img", "attn2.add_k_proj"), ("cross_attn.v_img", "attn2.add_v_proj"))
_BLOCK_FFN = (("ffn.0", "ffn.net.0.proj"), ("ffn.2", "ffn.net.2"))


@dataclasses.dataclass
class LoraUpdate:
    """The update of one diffusers transformer module (e.g. ``blocks.0.attn1.to_q``), float32.

    ``down`` ``[rank, in]`` and ``up`` ``[out, rank]``: the LoRA factors (any alpha diffusers folds
    already in). ``scale``: PEFT's scaling, applied before the user's adapter weight. ``diff``: a full
    weight delta ``[out, in]`` used in place of ``up @ down`` (only LightX2V's ``head.head.diff``).
    ``diff_b``: a bias delta ``[out]``; a module may have only this (diffusers then leaves its weight).
    """

    down: np.ndarray | None = None
    up: np.ndarray | None = None
    scale: float = 1.0
    diff: np.ndarray | None = None
    diff_b: np.ndarray | None = None

    @property
    def rank(self) -> int | None:
        return None if self.down is None else int(self.down.shape[0])

    def delta(self) -> np.ndarray | None:
        """The float32 weight delta ``[out, in]`` diffusers' ``fuse_lora`` adds (adapter weight 1.0);
        None for a bias-only update."""
        product = self.diff if self.diff is not None else None if self.up is None else self.up @ self.down
        return None if product is None else product * np.float32(self.scale)

    def bias_delta(self) -> np.ndarray | None:
        """The float32 bias delta ``[out]`` that ``fuse_lora`` adds, or None."""
        return None if self.diff_b is None else self.diff_b * np.float32(self.scale)


@dataclasses.dataclass
class LoraFile:
    """A LoRA file read for the Wan transformer: its updates keyed by diffusers module name."""

    path: Path
    format: str  # "diffusers", "wan-original", "lightx2v", "musubi" or "peft-wan"
    updates: dict[str, LoraUpdate]
    ranks: set[int]
    alphas: set[float] | None  # None: the file gives none (diffusers then uses alpha = rank)
    ignored: tuple[str, ...] = ()  # keys diffusers drops (other components, norm/modulation diffs, ...)

    def targets(self) -> list[str]:
        return sorted(self.updates)


def read_lora(path: str | Path) -> LoraFile:
    """Read a Wan LoRA (a ``.safetensors`` file, or a directory holding ``pytorch_lora_weights.safetensors``).

    As Wan's ``load_lora_weights`` does, only the transformer's keys are read: keys of other components
    (a text encoder's LoRA) are skipped and listed in :attr:`LoraFile.ignored`. Raises
    :class:`CheckpointError` (one line) for pickle files, unreadable or truncated files, and key layouts
    diffusers would not load.
    """
    path = Path(path)
    if path.is_dir():
        peft = (path / PEFT_WEIGHT_NAME).is_file() and not (path / LORA_WEIGHT_NAME).is_file()
        path = path / (PEFT_WEIGHT_NAME if peft else LORA_WEIGHT_NAME)
    pickled = CheckpointError(
        f"{path}: a pickle file; wanjax reads LoRAs from safetensors only (convert a trusted file with "
        "safetensors.torch.save_file(torch.load(path), 'lora.safetensors'))"
    )
    if path.suffix in _PICKLE_SUFFIXES:
        raise pickled
    try:
        refs = open_safetensors(path)  # checks the header, and the size for truncation
    except CheckpointError:
        if _looks_pickled(path):
            raise pickled from None
        raise
    if not refs:
        raise CheckpointError(f"{path}: no tensors")
    raw = (next(iter(refs.values())).handle.metadata() or {}).get(_METADATA_KEY)
    metadata = parse_json_object(raw, f"{path}: {_METADATA_KEY}", CheckpointError) if raw else None
    tensors = {name: ref.array() for name, ref in refs.items()}

    if any(k.startswith("diffusion_model.") for k in tensors):
        lightx2v = any(k.endswith((".diff", ".diff_b", ".diff_m")) for k in tensors)
        state, alphas, ignored = _convert_wan(path, tensors)
        return _lora_file(path, "lightx2v" if lightx2v else "wan-original", state, None, alphas, ignored)
    if any(k.startswith(_PEFT_PREFIX) for k in tensors):
        return _peft_model_file(path, tensors)
    if any(k.startswith("lora_unet_") for k in tensors):
        state, alphas = _convert_musubi(path, tensors)
        return _lora_file(path, "musubi", state, None, alphas, [])
    state, metadata, ignored = _diffusers_keys(path, tensors, metadata)
    return _lora_file(path, "diffusers", state, metadata, None, ignored)


def describe(lora: LoraFile) -> dict:
    """A JSON-ready summary for ``wanjax info``."""
    kinds = collections.Counter(re.sub(r"^blocks\.\d+\.", "", name) for name in lora.updates)
    return {
        "path": str(lora.path),
        "format": lora.format,
        "ranks": sorted(lora.ranks),
        "alphas": None if lora.alphas is None else sorted(lora.alphas),
        "modules": len(lora.updates),
        "targets": dict(sorted(kinds.items())),
        "diff": any(u.diff is not None for u in lora.updates.values()),
        "diff_b": any(u.diff_b is not None for u in lora.updates.values()),
        "ignored_keys": len(lora.ignored),
    }


# ----------------------------------------------------------------------------------------------
# Reading


def _looks_pickled(path: Path) -> bool:
    """A torch zip archive or a bare pickle (protocol 2 to 5), whatever its name."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return head == b"PK\x03\x04" or (len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5)


def _unrecognised(path: Path, key: str, recognised: int, total: int, why: str = "") -> CheckpointError:
    why = why or "not a layout diffusers loads into WanTransformer3DModel"
    return CheckpointError(
        f"{path}: unrecognised LoRA key {key!r} ({why}; {recognised} of {total} keys recognised)"
    )


def _f32(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float32)


def _times(a: np.ndarray, s: float) -> np.ndarray:
    """``a * s`` as torch computes it for a tensor times a Python float: in float32, rounded to a's dtype."""
    return (_f32(a) * np.float32(s)).astype(a.dtype)


def _fold_alpha(down: np.ndarray, up: np.ndarray, alpha: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """diffusers' ``get_alpha_scales``: ``alpha / rank`` split between the factors; also returns alpha."""
    value = float(_f32(alpha).reshape(-1)[0])
    scale_down, scale_up = value / down.shape[0], 1.0
    while scale_down * 2 < scale_up:
        scale_down *= 2
        scale_up /= 2
    return _times(down, scale_down), _times(up, scale_up), value


def _convert_wan(
    path: Path, tensors: dict[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], set[float], list[str]]:
    """``_convert_non_diffusers_wan_lora_to_diffusers``: diffusers-named state dict, alphas, dropped keys."""
    src = {k.removeprefix("diffusion_model."): v for k, v in tensors.items()}
    total = len(src)
    blocks = {int(k.split(".")[1]) for k in src if re.match(r"blocks\.\d+\.", k)}
    if not blocks:
        raise CheckpointError(
            f"{path}: no transformer block keys (diffusion_model.blocks.<i>.*); diffusers needs them"
        )
    down = "lora_A" if any("lora_A" in k for k in src) else "lora_down"
    up = "lora_B" if any("lora_B" in k for k in src) else "lora_up"
    has_time_projection = any(k.startswith("time_projection") and k.endswith(".weight") for k in src)
    ignored = [
        k
        for k in src
        if (k.endswith((".diff", ".diff_b")) and "norm" in k)
        or ("time_projection" in k and not has_time_projection)
    ]
    for k in ignored:
        del src[k]
    out: dict[str, np.ndarray] = {}
    alphas: set[float] = set()

    def move(
        theirs: str, ours: str, *, alpha: bool = True, require: bool = False, bias_with_up: bool = False
    ):
        a, b = src.pop(f"{theirs}.{down}.weight", None), src.pop(f"{theirs}.{up}.weight", None)
        if require and (a is None or b is None):
            missing = f"{theirs}.{down if a is None else up}.weight"
            raise CheckpointError(f"{path}: diffusion_model.{missing} missing (diffusers requires it)")
        if alpha and f"{theirs}.alpha" in src:
            if a is None or b is None:
                raise CheckpointError(f"{path}: diffusion_model.{theirs}.alpha without both LoRA factors")
            a, b, value = _fold_alpha(a, b, src.pop(f"{theirs}.alpha"))
            alphas.add(value)
        if a is not None:
            out[f"{ours}.lora_A.weight"] = a
        if b is not None:
            out[f"{ours}.lora_B.weight"] = b
        if f"{theirs}.diff_b" in src and (b is not None or not bias_with_up):
            out[f"{ours}.lora_B.bias"] = src.pop(f"{theirs}.diff_b")

    i2v = any("k_img" in k for k in src) and any("v_img" in k for k in src)
    for i in range(min(blocks), max(blocks) + 1):
        for theirs, ours in (*_BLOCK, *(_BLOCK_I2V if i2v else ()), *_BLOCK_FFN):
            move(f"blocks.{i}.{theirs}", f"blocks.{i}.{ours}")
    if any("time_projection" in k for k in src):
        move("time_projection.1", "condition_embedder.time_proj", alpha=False)
    if any("head.head" in k for k in src):
        move("head.head", "proj_out", alpha=False)
        if any("head.head" in k and k.endswith(".diff") for k in src):
            # diffusers: lora_A = head.head.diff, lora_B = identity sized by head.head.diff_b
            bias = out.get("proj_out.lora_B.bias")
            diff = src.pop("head.head.diff", None)
            if diff is None or bias is None or diff.shape[0] != bias.shape[0]:
                raise CheckpointError(
                    f"{path}: head.head.diff needs a matching head.head.diff_b (diffusers loads them together)"
                )
            out.pop("proj_out.lora_A.weight", None)
            out.pop("proj_out.lora_B.weight", None)
            out["proj_out.diff"] = diff
    for name, ours in (("text_embedding", "text_embedder"), ("time_embedding", "time_embedder")):
        for theirs, index in (("0", 1), ("2", 2)):
            if any(f"{name}.{theirs}" in k for k in src):
                move(
                    f"{name}.{theirs}", f"condition_embedder.{ours}.linear_{index}", alpha=False, require=True
                )
    for theirs, ours in (("img_emb.proj.1", "ff.net.0.proj"), ("img_emb.proj.3", "ff.net.2")):
        move(theirs, f"condition_embedder.image_embedder.{ours}", alpha=False, bias_with_up=True)

    leftover = list(src)
    if all(".diff" in k for k in leftover) and not any(k.endswith(".diff") and "lora" in k for k in leftover):
        ignored += leftover  # diffusers: "diff keys which we do not handle yet"
    else:
        key = next(k for k in leftover if ".diff" not in k or "lora" in k)
        raise _unrecognised(path, f"diffusion_model.{key}", total - len(leftover), total)
    return out, alphas, ignored


def _convert_musubi(path: Path, tensors: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], set[float]]:
    """``_convert_musubi_wan_lora_to_diffusers``: diffusers-named state dict and alphas."""
    src = {k.removeprefix("lora_unet_"): v for k, v in tensors.items()}
    total = len(src)
    stray = next((k for k in tensors if "blocks_" not in k.removeprefix("lora_unet_")), None)
    if stray is not None:
        raise _unrecognised(path, stray, 0, total, "musubi keys are lora_unet_blocks_<i>_<module>")
    blocks = len({k.split("blocks_")[1].split("_")[0] for k in src})
    i2v = any("k_img" in k for k in src) and any("v_img" in k for k in src)
    out: dict[str, np.ndarray] = {}
    alphas: set[float] = set()
    for i in range(blocks):
        for theirs, ours in (*_BLOCK, *(_BLOCK_I2V if i2v else ()), *_BLOCK_FFN):
            name = f"blocks_{i}_{theirs.replace('.', '_')}"
            keys = (f"{name}.lora_down.weight", f"{name}.lora_up.weight", f"{name}.alpha")
            missing = next((k for k in keys if k not in src), None)
            if missing is not None:
                raise CheckpointError(
                    f"{path}: lora_unet_{missing} missing (diffusers needs every musubi block's "
                    "attention and FFN projections, each with an alpha)"
                )
            a, b, value = _fold_alpha(*(src.pop(k) for k in keys))
            alphas.add(value)
            out[f"blocks.{i}.{ours}.lora_A.weight"] = a
            out[f"blocks.{i}.{ours}.lora_B.weight"] = b
    if src:
        raise _unrecognised(path, f"lora_unet_{next(iter(src))}", total - len(src), total)
    return out, alphas


def _diffusers_keys(
    path: Path, tensors: dict[str, np.ndarray], metadata: dict | None
) -> tuple[dict[str, np.ndarray], dict | None, list[str]]:
    """The transformer's keys of a diffusers/PEFT file (prefix removed), its LoraConfig, dropped keys."""
    total = len(tensors)
    ignored = [k for k in tensors if "dora_scale" in k]
    if ignored:
        warnings.warn(f"{path}: dropping {len(ignored)} dora_scale keys, as diffusers does", stacklevel=3)
    state = {k: v for k, v in tensors.items() if "dora_scale" not in k}
    bad = next((k for k in state if "lora" not in k), None)
    if bad is not None:  # load_lora_weights: "Make sure all LoRA param names contain `'lora'` substring"
        raise _unrecognised(path, bad, sum("lora" in k for k in state), total)
    # load_lora_weights loads with load_lora_adapter(prefix="transformer"); save_lora_weights prefixes
    # the metadata too. save_lora_adapter writes neither prefix (read as load_lora_adapter(prefix=None)).
    if any(k.startswith("transformer.") for k in state):
        ignored += [k for k in state if not k.startswith("transformer.")]
        state = {k.removeprefix("transformer."): v for k, v in state.items() if k.startswith("transformer.")}
    else:
        ignored += [k for k in state if k.startswith("text_encoder")]
        state = {k: v for k, v in state.items() if not k.startswith("text_encoder")}
    if metadata is not None and any(k.startswith("transformer.") for k in metadata):
        metadata = {
            k.removeprefix("transformer."): v for k, v in metadata.items() if k.startswith("transformer.")
        }
    if any(".lokr_" in k for k in state):
        raise CheckpointError(f"{path}: a LoKr adapter; wanjax reads LoRA adapters only")
    if any("lora_magnitude_vector" in k for k in state) or (metadata or {}).get("use_dora"):
        raise CheckpointError(
            f"{path}: a DoRA adapter (lora_magnitude_vector); wanjax does not support DoRA (merge it into "
            "the weights with diffusers: fuse_lora, then save_pretrained)"
        )
    # diffusers' convert_unet_state_dict_to_peft (older diffusers names); a no-op on PEFT names
    for old, new in ((".processor.", "."), (".lora.up", ".lora_B"), (".lora.down", ".lora_A")):
        state = {k.replace(old, new): v for k, v in state.items()}
    if metadata is not None and not metadata.get("lora_bias", False):
        ignored += [k for k in state if k.endswith(".lora_B.bias")]  # PEFT has no bias to load them into
        state = {k: v for k, v in state.items() if not k.endswith(".lora_B.bias")}
    return state, metadata, ignored


def _peft_model_file(path: Path, tensors: dict[str, np.ndarray]) -> LoraFile:
    """A PEFT ``save_pretrained`` adapter of the whole model (``base_model.model.`` keys), its
    ``LoraConfig`` read from ``adapter_config.json`` beside the file (see the module docstring)."""
    outside = next((k for k in tensors if not k.startswith(_PEFT_PREFIX)), None)
    if outside is not None:
        raise _unrecognised(path, outside, 0, len(tensors), f"outside {_PEFT_PREFIX}*")
    state = {k.removeprefix(_PEFT_PREFIX): v for k, v in tensors.items()}
    config_path = path.parent / PEFT_CONFIG_NAME
    config = None
    if config_path.is_file():
        config = parse_json_object(config_path.read_bytes(), str(config_path), CheckpointError)
    if config is not None and (
        config.get("use_dora") or config.get("rank_pattern") or config.get("alpha_pattern")
    ):
        raise CheckpointError(
            f"{config_path}: DoRA or per-module rank_pattern / alpha_pattern over the original Wan names; "
            "wanjax reads a plain LoRA of one r and lora_alpha"
        )
    try:
        state, _, ignored = _convert_wan(path, {f"diffusion_model.{k}": v for k, v in state.items()})
    except CheckpointError as e:  # the keys as the file names them
        raise CheckpointError(str(e).replace("diffusion_model.", _PEFT_PREFIX)) from None
    return _lora_file(path, "peft-wan", state, config, None, ignored)


def _pattern_key(patterns: dict, module: str) -> str:
    """PEFT's ``get_pattern_key``: the first pattern matching the end of ``module``, else ``module``."""
    return next((p for p in patterns if re.match(rf"(.*\.)?({p})$", module)), module)


def _peft_scale(path: Path, metadata: dict, module: str, rank: int | None) -> tuple[float, float]:
    """``(scale, alpha)`` that PEFT gives ``module`` under the LoraConfig ``metadata``."""
    rank_pattern, alpha_pattern = metadata.get("rank_pattern") or {}, metadata.get("alpha_pattern") or {}
    r = rank_pattern.get(_pattern_key(rank_pattern, module), metadata.get("r", 8))
    alpha = alpha_pattern.get(_pattern_key(alpha_pattern, module), metadata.get("lora_alpha", 8))
    if rank is not None and r != rank:
        raise CheckpointError(f"{path}: {module} has rank {rank} but the file's LoRA config says r={r}")
    return (alpha / math.sqrt(r) if metadata.get("use_rslora") else alpha / r), float(alpha)


def _lora_file(
    path: Path,
    format: str,
    state: dict[str, np.ndarray],
    metadata: dict | None,
    alphas: set[float] | None,
    ignored: list[str],
) -> LoraFile:
    """Group a diffusers-named state dict into per-module updates (PEFT's scaling applied)."""
    parts: dict[str, dict[str, np.ndarray]] = {}
    for i, key in enumerate(state):
        part = next((p for p in _PARTS if key.endswith(f".{p}")), None)
        module = key[: -len(part) - 1] if part else ""
        if not _MODULE.fullmatch(module):
            raise _unrecognised(path, key, i, len(state) + len(ignored))
        parts.setdefault(module, {})[part] = state[key]
    if not parts:
        raise CheckpointError(
            f"{path}: no LoRA weights for the Wan transformer ({len(ignored)} keys ignored)"
        )
    updates: dict[str, LoraUpdate] = {}
    ranks: set[int] = set()
    metadata_alphas: set[float] = set()
    for module, p in parts.items():
        down, up = p.get("lora_A.weight"), p.get("lora_B.weight")
        if (down is None) != (up is None):
            raise CheckpointError(f"{path}: {module} lacks lora_{'A' if down is None else 'B'}.weight")
        if down is not None and (down.ndim != 2 or up.ndim != 2 or down.shape[0] != up.shape[1]):
            raise CheckpointError(
                f"{path}: {module}: LoRA factors of shapes {down.shape} and {up.shape} do not chain"
            )
        scale = 1.0  # no config: diffusers sets every module's alpha to its rank
        if down is not None:
            ranks.add(down.shape[0])
        if metadata is not None:
            scale, alpha = _peft_scale(path, metadata, module, None if down is None else down.shape[0])
            metadata_alphas.add(alpha)
        updates[module] = LoraUpdate(
            down=None if down is None else _f32(down),
            up=None if up is None else _f32(up),
            scale=scale,
            diff=_f32(p["diff"]) if "diff" in p else None,
            diff_b=_f32(p["lora_B.bias"]) if "lora_B.bias" in p else None,
        )
    if metadata is not None:
        alphas = metadata_alphas
    return LoraFile(path, format, updates, ranks, alphas or None, tuple(ignored))
