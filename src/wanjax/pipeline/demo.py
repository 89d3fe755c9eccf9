"""The built-in smoke models: tiny Wan pipelines with random weights, in the diffusers layout.

The registry's demo entries (:mod:`wanjax.models.registry`) describe them: ``demo`` (Wan 2.1 text-to-video), ``demo-i2v`` (Wan 2.1
image-to-video: a CLIP image encoder and its processor, a transformer taking the image) and
``demo-a14b`` and ``demo-i2v-a14b`` (Wan 2.2 A14B-style: two experts, ``transformer_2`` after the
boundary; the image-to-video one conditions on the image's latents without CLIP) and
``demo-ti2v`` (Wan 2.2 TI2V-style: the Wan 2.2 VAE, ``expand_timesteps``, an optional image).
``demo_model_dir(cache, name)`` writes one on first use into the cache folder (see
:func:`wanjax.io.paths.cache_root`) as ``<name>-<hash>/`` with ``model_index.json``,
``tokenizer/``, ``text_encoder/``, ``transformer/``, ``vae/`` and ``scheduler/`` (and
``image_encoder/``, ``image_processor/``), and it is then loaded through exactly the code real
checkpoints use. Everything is generated deterministically
from fixed seeds with the run-time dependencies only (NumPy, safetensors, ``tokenizers``); the hash
covers the configs, the vocabulary and the generator, so a changed generator gets a new folder.
The folder is assembled under a temporary name and renamed when complete. A cache folder that
cannot be written does not stop a demo run: the model is then generated, with a warning, in a
temporary folder removed at exit.

Its output is structured noise: it exercises the whole engine quickly, it is not a trained model.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import string
import uuid
from pathlib import Path
from typing import Any

from safetensors.numpy import save_file
from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
from tokenizers.models import Unigram

from wanjax.io.checkpoint import random_checkpoint
from wanjax.io.component import Component
from wanjax.io.paths import scratch_dir, writable_dir
from wanjax.models.clip_vision import IMAGE_ENCODER
from wanjax.models.dit import TRANSFORMER, TRANSFORMER_2
from wanjax.models.image_processor import IMAGE_PROCESSOR, ImageProcessorConfig
from wanjax.models.registry import DEMO_IMAGE_ENCODER, DEMO_TRANSFORMER, Variant, registry
from wanjax.models.umt5 import TEXT_ENCODER, UMT5Config
from wanjax.models.vae import VAE

DEMO_NAME = "demo"
SMOKE_NOTE = "wanjax built-in demo: tiny random weights, a smoke model (its videos are noise)"
# Bump when the generator changes in a way the configs below do not show.
GENERATOR_VERSION = 2
SEED = 0

# Special tokens first, with T5's ids: <pad>=0, </s>=1, <unk>=2.
SPECIAL_TOKENS = ("<pad>", "</s>", "<unk>")
_WORD_LIST = (
    "a an the of and in on with at to is are by for from under over into its their this that "
    "cat dog bird fish horse robot person man woman child people car boat train city street forest "
    "river sea ocean beach mountain sky cloud sun moon snow rain fire water light night day garden "
    "kitchen room house road park field flower tree grass piano guitar jazz club cake ball "
    "walks runs plays dances flies swims jumps sits looks rides bakes sings "
    "red blue green yellow white black golden bright dark small big old young happy slow fast "
    "cinematic realistic detailed beautiful camera close shot view scene video high quality "
    "blurry low static noise ugly"
)
WORDS = tuple(_WORD_LIST.split())

DEMO_IMAGE_PROCESSOR = ImageProcessorConfig(
    size={"shortest_edge": DEMO_IMAGE_ENCODER.image_size},
    crop_size={"height": DEMO_IMAGE_ENCODER.image_size, "width": DEMO_IMAGE_ENCODER.image_size},
)
DEMO_SCHEDULER: dict[str, Any] = {
    "_class_name": "UniPCMultistepScheduler",
    "num_train_timesteps": 1000,
    "solver_order": 2,
    "prediction_type": "flow_prediction",
    "use_flow_sigmas": True,
    "flow_shift": 3.0,
    "predict_x0": True,
    "solver_type": "bh2",
    "lower_order_final": True,
}


# What happens when the cache folder cannot be written, as the warning says it.
UNCACHED = (
    "the demo model is generated in a temporary folder for this run: "
    "set $WANJAX_CACHE to a writable folder to keep it"
)


def demo_variants() -> dict[str, Variant]:
    """The demo models of the registry, by name."""
    return {name: v for name, v in registry().items() if v.demo}


def demo_variant(name: str) -> Variant:
    return demo_variants()[name]


def demo_vocabulary() -> list[tuple[str, float]]:
    """Unigram pieces with log-probability scores: specials, single characters, then whole words."""
    chars = sorted(set("".join(WORDS)) | set(string.ascii_uppercase + string.digits + ",.!?'-:;()"))
    scores = {t: 0.0 for t in SPECIAL_TOKENS}
    scores["▁"] = -2.0
    for i, word in enumerate(WORDS):
        scores.setdefault("▁" + word, -4.0 - 0.01 * i)
    for c in chars:
        scores.setdefault(c, -8.0)
        scores.setdefault("▁" + c, -9.0)
    return list(scores.items())


def demo_text_encoder_config() -> UMT5Config:
    return UMT5Config(
        vocab_size=len(demo_vocabulary()),
        d_model=DEMO_TRANSFORMER.text_dim,
        d_kv=16,
        d_ff=128,
        num_layers=2,
        num_heads=4,
    )


def _tokenizer_files() -> dict[str, str]:
    """``tokenizer.json`` and ``tokenizer_config.json`` of a T5-style Unigram tokenizer."""
    tok = Tokenizer(Unigram(demo_vocabulary(), unk_id=2, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    config = {
        "tokenizer_class": "T5Tokenizer",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "model_max_length": 512,
    }
    return {"tokenizer.json": tok.to_str(pretty=True), "tokenizer_config.json": json.dumps(config, indent=2)}


def _components(variant: Variant) -> dict[Component, tuple[Any, dict[str, Any], tuple[str, str]]]:
    """component -> (config, config file contents, model_index entry)."""
    te = demo_text_encoder_config()
    te_config = {**te.to_dict(), "architectures": ["UMT5EncoderModel"], "dtype": "float32"}
    dit = variant.transformer
    dit_config = {**dit.to_dict(), "_class_name": variant.transformer_class}
    components = {
        TEXT_ENCODER: (te, te_config, ("transformers", "UMT5EncoderModel")),
        TRANSFORMER: (dit, dit_config, ("diffusers", variant.transformer_class)),
        VAE: (variant.vae, variant.vae.to_dict(), ("diffusers", "AutoencoderKLWan")),
    }
    if variant.boundary_ratio is not None:
        components[TRANSFORMER_2] = (dit, dit_config, ("diffusers", variant.transformer_class))
    if variant.image_encoder is not None:
        clip = variant.image_encoder
        clip_config = {**clip.to_dict(), "architectures": ["CLIPVisionModel"], "dtype": "float32"}
        processor = DEMO_IMAGE_PROCESSOR
        components[IMAGE_ENCODER] = (clip, clip_config, ("transformers", "CLIPVisionModel"))
        components[IMAGE_PROCESSOR] = (processor, processor.to_dict(), ("transformers", "CLIPImageProcessor"))
    return components


def demo_fingerprint(name: str = DEMO_NAME) -> str:
    """Short hash of everything the generated files of demo model ``name`` depend on."""
    variant = demo_variant(name)
    described = {
        "generator": GENERATOR_VERSION,
        "seed": SEED,
        "pipeline": variant.pipeline_class,
        "boundary_ratio": variant.boundary_ratio,
        "expand_timesteps": variant.expand_timesteps,
        "configs": {c.folder: config for c, (_, config, _) in _components(variant).items()},
        "scheduler": DEMO_SCHEDULER,
        "tokenizer": _tokenizer_files(),
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:12]


def _folder(item: tuple[Component, Any]) -> str:
    return item[0].folder


def write_demo_model(directory: str | Path, name: str = DEMO_NAME) -> Path:
    """Write demo model ``name`` into ``directory`` (created; existing files are overwritten)."""
    variant = demo_variant(name)
    root = Path(directory)
    index: dict[str, Any] = {
        "_class_name": variant.pipeline_class,
        "_wanjax_demo": {"note": SMOKE_NOTE, "fingerprint": demo_fingerprint(name)},
    }
    if variant.boundary_ratio is not None:
        index["boundary_ratio"] = variant.boundary_ratio
    if variant.expand_timesteps:
        index["expand_timesteps"] = True
    for i, (component, (cfg, config, entry)) in enumerate(sorted(_components(variant).items(), key=_folder)):
        folder = root / component.folder
        folder.mkdir(parents=True, exist_ok=True)
        if component.has_weights:
            tensors = random_checkpoint(component.spec(cfg, ()), SEED + i)
            weights = folder / f"{component.weight_stems[0]}.safetensors"
            save_file(tensors, str(weights), metadata={"format": "pt"})
        (folder / component.config_file).write_text(json.dumps(config, indent=2))
        index[component.folder] = list(entry)
    (root / "tokenizer").mkdir(parents=True, exist_ok=True)
    for file, text in _tokenizer_files().items():
        (root / "tokenizer" / file).write_text(text)
    index["tokenizer"] = ["transformers", "T5TokenizerFast"]
    (root / "scheduler").mkdir(parents=True, exist_ok=True)
    (root / "scheduler" / "scheduler_config.json").write_text(json.dumps(DEMO_SCHEDULER, indent=2))
    index["scheduler"] = ["diffusers", "UniPCMultistepScheduler"]
    (root / "model_index.json").write_text(json.dumps(dict(sorted(index.items())), indent=2))
    return root


def demo_model_dir(parent: str | Path, name: str = DEMO_NAME) -> Path:
    """The directory of demo model ``name`` under ``parent``, generated on first use (atomically:
    built aside, then renamed); in :func:`~wanjax.io.paths.scratch_dir` instead, with a warning, when
    ``parent`` cannot be written."""
    target = Path(parent) / f"{name}-{demo_fingerprint(name)}"
    if not _complete(target) and not writable_dir(target.parent, "the wanjax cache", UNCACHED):
        target = scratch_dir() / target.name
    if _complete(target):
        return target
    staging = target.parent / f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    staging.mkdir(parents=True)
    try:
        write_demo_model(staging, name)
        try:
            staging.rename(target)
        except OSError:  # another process finished first: keep its copy
            if not _complete(target):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _complete(directory: Path) -> bool:
    return (directory / "model_index.json").is_file()


def is_demo_model(path: str | Path) -> bool:
    """Whether ``path`` is a model directory written by :func:`write_demo_model`."""
    index = Path(path) / "model_index.json"
    try:
        return "_wanjax_demo" in json.loads(index.read_text())
    except (OSError, json.JSONDecodeError):
        return False
