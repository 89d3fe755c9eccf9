"""The model registry: every entry point takes a variant's defaults from it, and an entry added there
alone appears in ``plan``, ``bench --arch`` and ``info``."""

from __future__ import annotations

import argparse
import dataclasses
import json

import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from wanjax.cli.main import main
from wanjax.jobs.checks import resolve_video
from wanjax.jobs.groups import SamplingFlags
from wanjax.jobs.opening import defaults_of
from wanjax.jobs.sampling import sampling_params
from wanjax.models import registry
from wanjax.models.dit import TRANSFORMER, TRANSFORMER_2
from wanjax.models.registry import Defaults, Variant
from wanjax.pipeline import preparation
from wanjax.pipeline.demo import DEMO_SCHEDULER
from wanjax.pipeline.pipeline import WanPipeline
from wanjax.runtime.timing import StepTimes
from wanjax.sampling.results import Denoised
from wanjax.server.api import job_params


def config_only_checkpoint(parent, v: Variant):
    """A diffusers-layout folder named as ``v``'s repository, with configs and no weights."""
    root = parent / (v.repo or v.name).split("/")[-1]
    index = {"_class_name": v.pipeline_class, "scheduler": ["diffusers", "UniPCMultistepScheduler"]}
    if v.boundary_ratio is not None:
        index["boundary_ratio"] = v.boundary_ratio
    if v.expand_timesteps:
        index["expand_timesteps"] = True
    folders = [TRANSFORMER] + ([TRANSFORMER_2] if v.boundary_ratio is not None else [])
    for component in folders:
        (root / component.folder).mkdir(parents=True)
        (root / component.folder / component.config_file).write_text(json.dumps(v.transformer.to_dict()))
        index[component.folder] = ["diffusers", v.transformer_class]
    (root / "scheduler").mkdir()
    (root / "scheduler" / "scheduler_config.json").write_text(json.dumps(DEMO_SCHEDULER))
    (root / "model_index.json").write_text(json.dumps(index))
    return root


def python_call_values(pipe: WanPipeline, image: Image.Image | None, monkeypatch) -> dict:
    """What ``pipe(prompt)`` (given only an image where the model needs one) runs with: the stages are
    replaced by recorders, so no weight is read."""
    seen: dict = {}
    text = pipe.components.transformer_config.text_dim

    def encode_prompt(prompt, negative, length):
        return jnp.zeros((1, 4, text)), jnp.zeros((1, 4, text))

    def prepare_latents(batch, height, width, frames, seed):
        seen.update(height=height, width=width, frames=frames, seed=seed)
        return jnp.zeros(pipe.components.geometry.latent_shape(batch, height, width, frames))

    def denoise(cond, uncond, latents, options, **kwargs):
        seen.update(steps=options.num_inference_steps, guidance=options.guidance_scale)
        return Denoised(latents, StepTimes())

    pipe.encode_prompt, pipe.prepare_latents, pipe.denoise = encode_prompt, prepare_latents, denoise
    for name in ("image_conditioning", "vace_control"):
        monkeypatch.setattr(preparation, name, lambda *args, **kwargs: None)
    pipe.decode = lambda latents, progress=False: None
    last = image if pipe.components.transformer_config.first_last_frame else None
    pipe("a cat", image=image, last_image=last, progress=False)
    return seen


# An Animate model's run takes its length from its pose video, not a frame count (its defaults:
# tests/test_animate_pipeline.py)
NOT_ANIMATE = [name for name, v in registry.registry().items() if not v.transformer.animate]


@pytest.mark.parametrize("name", NOT_ANIMATE)
def test_every_entry_point_uses_the_registry_defaults(name, tmp_path, monkeypatch):
    """``WanPipeline(...)(prompt)``, ``wanjax generate`` and the server fill what a request leaves out
    with the same values: the registry entry's (recognised from a checkpoint of its configs and its
    repository's name; a demo model by its name)."""
    v = registry.variant(name)
    d = v.defaults
    pipe = WanPipeline.from_pretrained(
        name if v.demo else config_only_checkpoint(tmp_path, v), jax_cache_dir=False
    )
    assert pipe.components.variant == v and pipe.defaults == d
    needs_image = v.transformer.image_to_video and not v.expand_timesteps
    # an image of the default's aspect: the video keeps it at the default area
    image = Image.fromarray(np.zeros((d.height, d.width, 3), np.uint8)) if needs_image else None
    expected = dict(height=d.height, width=d.width, frames=d.frames, seed=d.seed)
    python = python_call_values(pipe, image, monkeypatch)
    assert python == {**expected, "steps": d.num_inference_steps, "guidance": d.guidance_scale}

    video = resolve_video(pipe, {}, {}, None, 1, None, image)
    sampling = sampling_params(pipe, SamplingFlags())
    cli = {**video, "seed": sampling["seed"]}
    assert cli == expected
    assert (sampling["num_inference_steps"], sampling["guidance_scale"]) == (
        python["steps"],
        python["guidance"],
    )
    assert defaults_of(pipe).fps == d.fps

    params, _ = job_params({"prompt": "a cat"}, defaults_of(pipe), pipe.components.geometry.temporal, name)
    server = {k: params[k] for k in ("height", "width", "frames", "seed")}
    assert server == expected
    assert (params["num_inference_steps"], params["guidance_scale"], params["fps"]) == (
        d.num_inference_steps,
        d.guidance_scale,
        d.fps,
    )


def test_the_720p_variant_is_told_by_its_repository_name(tmp_path):
    """Wan 2.1 I2V 480P and 720P share one architecture: the folder's name picks the entry; an unnamed
    checkpoint of that architecture gets the 480P one's defaults."""
    hd = registry.variant("I2V-14B-720P")
    assert registry.match(hd.transformer, name="/hub/Wan-AI/Wan2.1-I2V-14B-720P-Diffusers") == hd
    assert registry.match(hd.transformer, name="my-finetune").name == "I2V-14B"
    assert registry.defaults_for(hd.transformer, name="my-finetune") == Defaults()


def test_an_unknown_architecture_gets_the_defaults_of_its_kind():
    """A checkpoint no entry describes: a TI2V one gets TI2V-5B's size, a text-to-video one diffusers'."""
    odd = dataclasses.replace(registry.WAN22_5B, num_layers=3)
    assert registry.match(odd, expand_timesteps=True) is None
    assert registry.defaults_for(odd, expand_timesteps=True) == registry.variant("5B").defaults
    assert registry.defaults_for(registry.TINY) == Defaults()


NEW = Variant(
    "test-3B",
    "a variant added for this test",
    dataclasses.replace(registry.WAN21_1_3B, num_attention_heads=20, num_layers=4),
    registry.WAN21_VAE,
    repo="example/Wan-test-3B",
    defaults=Defaults(height=544, width=960),
)


@pytest.fixture
def with_new_variant(monkeypatch):
    monkeypatch.setattr(registry, "VARIANTS", (*registry.VARIANTS, NEW))


def test_a_variant_added_to_the_registry_alone_appears_in_plan_bench_and_info(with_new_variant, capsys):
    from wanjax.tools import bench

    assert main(["plan", "--model", NEW.name, "--num_devices", "1", "--device_memory", "80GiB"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{NEW.name}: ") and "denoise" in out and "fits" in out

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--arch", NEW.name])
    assert args.arch == NEW.name and bench.BenchConfig(arch=NEW.name).variant == NEW

    assert main(["info", NEW.name]) == 0
    out = capsys.readouterr().out
    assert NEW.title in out and "960x544" in out and "20x128 heads" in out


def test_the_readme_models_table_is_the_registry():
    """Each released variant's row in the README (name, checkpoint, size, frames, fps) says what its
    registry entry says, and every released variant has one."""
    from pathlib import Path

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    rows = {}
    for line in readme.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`") and cells[0].count("`") == 2:
            rows[cells[0].strip("`")] = cells
    for name, v in registry.released().items():
        d = v.defaults
        _, _, checkpoint, video = rows[name]
        assert checkpoint.startswith(f"`{v.repo}`"), name
        assert video == f"{d.width}x{d.height}, {d.frames}, {d.fps:g}", name
