"""Wan 2.2 A14B-style two-expert pipelines against diffusers, on tiny random pipelines saved with
``save_pretrained``: text to video (``WanPipeline`` with ``transformer_2`` and ``boundary_ratio``) and
image to video (``WanImageToVideoPipeline`` without a CLIP encoder). The experts switch at the step
diffusers switches (read from which of its transformers ran), each with its guidance scale; the
latents and frames are diffusers'; ``generate``, the three stages and model offload (the experts
taking turns on the device) give the same frames; LoRAs and step caches go per expert as diffusers'
``load_into_transformer_2`` and a cache hook on each transformer.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers.compare import relative_error
from helpers.models import noise_file, randomize_
from helpers.pipelines import NEGATIVE, PROMPT, reference_run, save_tiny, tiny_components
from PIL import Image
from safetensors.numpy import load_file

from wanjax import WanPipeline
from wanjax.cli.main import main
from wanjax.errors import WanjaxError
from wanjax.pipeline import preparation, stages
from wanjax.sampling.results import Denoised

HEIGHT, WIDTH, FRAMES, STEPS = 48, 64, 9, 4
BOUNDARY = 0.9  # 4 UniPC steps at shift 3: timesteps 999, 900 | 750, 500 (900 >= 900: the edge case)
GUIDANCE, GUIDANCE_2 = 5.0, 3.0


def build(root, tokenizer_dir, pipeline_class, **transformer):
    """A two-expert pipeline of ``pipeline_class`` saved under ``root``; diffusers' copy read back."""
    components = tiny_components(tokenizer_dir, **transformer)
    first = components["transformer"]
    second = randomize_(type(first).from_config(first.config), seed=7, std=0.2).eval()
    pipe = pipeline_class(**components, transformer_2=second, boundary_ratio=BOUNDARY)
    save_tiny(pipe, root, tokenizer_dir)
    return pipeline_class.from_pretrained(root)


@pytest.fixture(scope="module")
def noise(tmp_path_factory):
    return noise_file(tmp_path_factory, (1, 16, 3, HEIGHT // 8, WIDTH // 8))


@pytest.fixture(scope="module")
def t2v(tmp_path_factory, tokenizer_dir):
    from diffusers import WanPipeline as ReferencePipeline

    root = tmp_path_factory.mktemp("a14b_t2v")
    return root, build(root, tokenizer_dir, ReferencePipeline)


@pytest.fixture(scope="module")
def i2v(tmp_path_factory, tokenizer_dir):
    from diffusers import WanImageToVideoPipeline

    root = tmp_path_factory.mktemp("a14b_i2v")
    return root, build(root, tokenizer_dir, WanImageToVideoPipeline, in_channels=36, out_channels=16)


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    path = tmp_path_factory.mktemp("image") / "image.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (37, 53, 3), dtype=np.uint8)).save(path)
    return path


def diffusers_run(pipe, noise, **kwargs) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Final latents, uint8 frames, and the expert of each step (which transformer ran first in it)."""
    calls: list[int] = []
    hooks = [
        model.register_forward_hook(lambda m, i, o, k=k: calls.append(k))
        for k, model in enumerate((pipe.transformer, pipe.transformer_2))
    ]
    guidance = {"guidance_scale": GUIDANCE, "guidance_scale_2": GUIDANCE_2}
    try:
        latents, frames = reference_run(pipe, HEIGHT, WIDTH, FRAMES, STEPS, noise, **guidance, **kwargs)
    finally:
        for hook in hooks:
            hook.remove()
    return latents, frames, calls[::2]  # two calls (CFG) per step


def our_run(pipe: WanPipeline, noise, conditioning=None, **denoise) -> Denoised:
    """``pipe``'s denoising of PROMPT / NEGATIVE from ``noise``, with each expert's guidance."""
    pos, neg = pipe.encode_prompt(PROMPT, NEGATIVE)
    return pipe.denoise(
        pos,
        neg,
        noise[0].numpy(),
        num_inference_steps=STEPS,
        guidance_scale=GUIDANCE,
        guidance_scale_2=GUIDANCE_2,
        progress=False,
        image=conditioning,
        **denoise,
    )


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["t2v", "i2v"])
def test_two_experts_switch_where_diffusers_does_and_give_its_latents_and_frames(
    variant, request, noise, image
):
    root, reference = request.getfixturevalue(variant)
    extra = {"image": Image.open(image).convert("RGB")} if variant == "i2v" else {}
    latents_ref, frames_ref, experts_ref = diffusers_run(reference, noise[0], **extra)
    assert experts_ref == [0, 0, 1, 1]

    pipe = WanPipeline.from_pretrained(root, dtype="float32", jax_cache_dir=False)
    assert pipe.components.boundary_ratio == BOUNDARY
    conditioning = None
    if variant == "i2v":  # no image encoder: the conditioning latents alone
        conditioning = preparation.image_conditioning(
            pipe.components, extra["image"], 1, HEIGHT, WIDTH, FRAMES
        )
        assert conditioning.image_embeds is None
    denoised = our_run(pipe, noise, conditioning)
    latents = denoised.latents
    assert list(denoised.expert_steps) == experts_ref
    assert relative_error(latents, latents_ref) <= 1e-5
    frames = pipe.decode(latents)
    assert frames_ref.std() > 20 and np.abs(frames.astype(np.int16) - frames_ref).max() <= 2


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["t2v", "i2v"])
@pytest.mark.bit_for_bit
def test_generate_three_stages_and_offload_give_the_same_frames(variant, request, noise, image, tmp_path):
    """``generate`` (float32, diffusers' noise) gives diffusers' frames; the three stages and
    ``--offload model`` (one expert on the device at a time) give exactly ``generate``'s."""
    root, reference = request.getfixturevalue(variant)
    image_flags = ("--image", str(image)) if variant == "i2v" else ()
    extra = {"image": Image.open(image).convert("RGB")} if variant == "i2v" else {}
    latents_ref, frames_ref, _ = diffusers_run(reference, noise[0], **extra)
    text = ("--model", str(root), "--prompt", PROMPT, "--negative_prompt", NEGATIVE, "--dtype", "float32")
    video = ("--height", HEIGHT, "--width", WIDTH, "--frames", FRAMES)
    sampling = (
        "--num_inference_steps",
        STEPS,
        "--guidance_scale",
        GUIDANCE,
        "--guidance_scale_2",
        GUIDANCE_2,
    )
    init = ("--init_latents", str(noise[1]))

    def cli(*args) -> None:
        assert main(list(map(str, args))) == 0

    out = ("--output_video", tmp_path / "g.mp4")
    cli("generate", *text, *image_flags, *video, *sampling, *init, *out, "--frames_out", tmp_path / "g.npy")
    generated = np.load(tmp_path / "g.npy")
    assert np.abs(generated.astype(np.int16) - frames_ref).max() <= 2
    cli(
        "generate",
        *text,
        *image_flags,
        *video,
        *sampling,
        *init,
        *out,
        "--offload",
        "model",
        "--frames_out",
        tmp_path / "o.npy",
    )
    np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), generated)

    d = tmp_path / "stages"
    cli("encode", *text, *image_flags, *video, "--output_dir", d)
    cli("denoise", "--input_dir", d, *sampling, *init)
    cli("decode", "--input_dir", d, "--frames_out", d / "s.npy")
    np.testing.assert_array_equal(np.load(d / "s.npy"), generated)
    assert relative_error(load_file(d / stages.LATENTS_FILE)["latents"], latents_ref) <= 1e-4
    config = stages.read_config(d)
    assert config["boundary_ratio"] == BOUNDARY and config["guidance_scale_2"] == GUIDANCE_2


@pytest.mark.slow
def test_boundary_and_second_guidance_are_two_expert_flags(t2v, tiny_pipeline_dir, noise, capsys, tmp_path):
    """``boundary_ratio=`` overrides the checkpoint's (diffusers with that config switches alike);
    on a one-transformer model both settings are errors."""
    root, reference = t2v
    pipe = WanPipeline.from_pretrained(root, dtype="float32", jax_cache_dir=False)
    pos, neg = pipe.encode_prompt(PROMPT, NEGATIVE)
    denoised = pipe.denoise(
        pos, neg, noise[0].numpy(), num_inference_steps=STEPS, boundary_ratio=0.6, progress=False
    )
    reference.register_to_config(boundary_ratio=0.6)
    try:
        assert list(denoised.expert_steps) == diffusers_run(reference, noise[0])[2] == [0, 0, 0, 1]
    finally:
        reference.register_to_config(boundary_ratio=BOUNDARY)
    one = WanPipeline.from_pretrained(tiny_pipeline_dir, dtype="float32", jax_cache_dir=False)
    with pytest.raises(WanjaxError, match="for two-expert models"):
        one.denoise(
            pos, neg, noise[0].numpy(), num_inference_steps=STEPS, guidance_scale_2=2.0, progress=False
        )
    out = tmp_path / "never.mp4"
    small = ["--height", "48", "--width", "64", "--frames", "9", "--output_video", str(out)]
    args = ["generate", "--model", str(tiny_pipeline_dir), "--prompt", "a cat", *small]
    assert main([*args, "--boundary_ratio", "0.5"]) == 2
    assert "has one transformer" in capsys.readouterr().err
    assert main([*args, "--boundary_ratio", "1.5"]) == 2
    assert "--boundary_ratio must be between 0 and 1" in capsys.readouterr().err
    assert not out.exists()


def expert_lora(path, seed: int) -> str:
    """A LoRA (original Wan names, with alphas) of the tiny transformer's block projections."""
    from helpers.lora import add_factors
    from safetensors.torch import save_file

    sd, gen = {}, torch.Generator().manual_seed(seed)
    for i in range(2):
        for module, shape in {"self_attn.q": (24, 24), "cross_attn.v": (24, 24), "ffn.0": (32, 24)}.items():
            add_factors(sd, gen, f"diffusion_model.blocks.{i}.{module}", shape, 4, alpha=2.0)
    save_file(sd, path)
    return str(path)


@pytest.mark.slow
def test_loras_per_expert_equal_diffusers_load_into_transformer_2(
    t2v, tiny_pipeline_dir, noise, capsys, tmp_path
):
    """Wan 2.2 LoRAs come as high-noise / low-noise pairs: ``loras`` go into ``transformer``,
    ``loras_2`` (``--lora_2``) into ``transformer_2``, as diffusers' ``load_lora_weights(...,
    load_into_transformer_2=True)`` (fused, float32): the same latents and frames; without the
    low-noise LoRA the latents are far from them; a one-transformer model refuses ``--lora_2``."""
    from diffusers import WanPipeline as ReferencePipeline

    root, _ = t2v
    high, low = expert_lora(tmp_path / "high.safetensors", 20), expert_lora(tmp_path / "low.safetensors", 21)
    weights = (0.8, 1.2)
    reference = ReferencePipeline.from_pretrained(root)
    reference.load_lora_weights(high, adapter_name="high")
    reference.load_lora_weights(low, adapter_name="low", load_into_transformer_2=True)
    reference.set_adapters(["high", "low"], list(weights))
    reference.fuse_lora(components=["transformer", "transformer_2"], adapter_names=["high", "low"])
    latents_ref, frames_ref, experts = diffusers_run(reference, noise[0])
    assert experts == [0, 0, 1, 1]

    def latents(loras_2) -> np.ndarray:
        loras = [(high, weights[0])]
        return our_run(
            WanPipeline.from_pretrained(
                root, dtype="float32", jax_cache_dir=False, loras=loras, loras_2=loras_2
            ),
            noise,
        ).latents

    assert relative_error(latents([(low, weights[1])]), latents_ref) <= 1e-5
    assert relative_error(latents([]), latents_ref) > 1e-2  # the low-noise expert's LoRA matters

    lora = ["--lora", f"{high}:{weights[0]}", "--lora_2", f"{low}:{weights[1]}"]
    video = ["--height", str(HEIGHT), "--width", str(WIDTH), "--frames", str(FRAMES)]
    sampling = ["--num_inference_steps", str(STEPS), "--guidance_scale", str(GUIDANCE)]
    sampling += ["--guidance_scale_2", str(GUIDANCE_2), "--init_latents", str(noise[1])]
    text = ["--prompt", PROMPT, "--negative_prompt", NEGATIVE, "--dtype", "float32"]
    out = ["--output_video", str(tmp_path / "v.mp4"), "--frames_out", str(tmp_path / "v.npy")]
    assert main(["generate", "--model", str(root), *text, *video, *sampling, *lora, *out]) == 0
    assert np.abs(np.load(tmp_path / "v.npy").astype(np.int16) - frames_ref).max() <= 2
    record = json.loads((tmp_path / "v.json").read_text())["arguments"]
    assert record["lora"] == [lora[1]] and record["lora_2"] == [lora[3]]

    never = ["--output_video", str(tmp_path / "never.mp4")]
    capsys.readouterr()
    assert main(["generate", "--model", str(tiny_pipeline_dir), *text, *video, *lora, *never]) == 2
    err = capsys.readouterr().err
    assert "has one transformer: LoRAs for transformer_2" in err and len(err.strip().splitlines()) == 1
    assert main(["generate", "--model", str(root), *text, *video, "--lora_2", f"{low}:inf", *never]) == 2
    assert "--lora_2 " in capsys.readouterr().err and not (tmp_path / "never.mp4").exists()


def diffusers_cached_run(
    root, noise, configs, policy: str
) -> tuple[dict[str, list[bool]], np.ndarray, np.ndarray]:
    """diffusers' run of the two-expert pipeline at ``root`` with ``configs[k]`` enabled on expert
    ``k``'s transformer (``enable_cache``): per-branch decisions of each step (from the leader hook of
    the transformer that ran it), final latents, frames."""
    from diffusers import WanPipeline as ReferencePipeline
    from helpers.pipelines import branch_decisions

    reference = ReferencePipeline.from_pretrained(root)
    experts = [0, 0, 1, 1]  # as test_two_experts_switch_where_diffusers_does_and_give_its_latents_and_frames
    decisions: list[dict[str, bool]] = []

    def on_step(p, i, t, kwargs):
        model = p.transformer if experts[i] == 0 else p.transformer_2
        decisions.append(branch_decisions(model, policy))

    for model, config in zip((reference.transformer, reference.transformer_2), configs, strict=True):
        model.enable_cache(config)
    latents, frames, ran = diffusers_run(reference, noise[0], on_step=on_step)
    assert ran == experts
    return {name: [d[name] for d in decisions] for name in ("cond", "uncond")}, latents, frames


CURVE = [1.0, 0.99, 1.0, 0.99]  # four steps: each expert computes its first, reuses at its second
MAG = dict(threshold=0.05, max_skip_steps=2, retention_ratio=0.0)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["firstblock", "magcache", "seacache", "taylorseer"])
def test_step_cache_per_expert_equals_diffusers(policy, t2v, noise):
    """Step caching on a two-expert model, as diffusers runs it with a hook on each transformer
    (``enable_cache`` on both): each expert starts from an empty cache (its first step computes, even
    where a shared cache would skip it) and decides from its own state; First-Block Cache from its
    residuals, MagCache from its slice of one curve over the whole run (MagCacheConfig per expert
    with that slice), SeaCache from its own indicator history at the run's step indices, TaylorSeer
    counting its own calls from 0; the same decisions per branch, latents and frames."""
    from diffusers.hooks import FirstBlockCacheConfig, MagCacheConfig, SeaCacheConfig, TaylorSeerCacheConfig

    from wanjax.sampling.cache.step_cache import CacheConfig

    root, _ = t2v
    if policy == "firstblock":
        threshold = 0.6  # each expert reuses its cache at its second step
        configs = [FirstBlockCacheConfig(threshold=threshold)] * 2
        ours = CacheConfig("firstblock", threshold=threshold)
    elif policy == "seacache":  # no forced first or last steps: each expert's second step reuses
        options = dict(threshold=100.0, retention_steps=0, cache_end_steps=0)
        configs, ours = [SeaCacheConfig(**options)] * 2, CacheConfig("seacache", options=options)
    elif policy == "taylorseer":  # each expert: its first call computes, its second is predicted
        options = dict(use_lite_mode=True, cache_interval=2, disable_cache_before_step=1)
        ours = CacheConfig("taylorseer", options={**options, "taylor_factors_dtype": "float32"})
        configs = [TaylorSeerCacheConfig(**options, taylor_factors_dtype=torch.float32) for _ in range(2)]
    else:
        configs = [MagCacheConfig(mag_ratios=CURVE[k : k + 2], num_inference_steps=2, **MAG) for k in (0, 2)]
        ours = CacheConfig("magcache", mag_ratios=CURVE, **MAG)
    computed_ref, latents_ref, frames_ref = diffusers_cached_run(root, noise, configs, policy)
    assert computed_ref == {"cond": [True, False, True, False], "uncond": [True, False, True, False]}

    pipe = WanPipeline.from_pretrained(root, dtype="float32", jax_cache_dir=False)
    denoised = our_run(pipe, noise, cache=ours)
    latents = denoised.latents
    assert denoised.cache_report.computed == computed_ref
    assert relative_error(latents, latents_ref) <= 1e-5
    assert np.abs(pipe.decode(latents).astype(np.int16) - frames_ref).max() <= 2


def test_magcache_with_two_experts_defaults_to_the_wan22_curve():
    """Without --mag_ratios a two-expert model takes the MagCache authors' Wan 2.2 A14B curve (one over
    both experts), never the Wan 2.1 14B one its transformer's dimensions would match alone; each
    expert's steps are scheduled from their slice of it."""
    from wanjax.models.registry import transformer_preset
    from wanjax.sampling.cache import step_cache

    a14b = transformer_preset("A14B")
    assert step_cache.preset_for(a14b) == "wan2.1-t2v-14b"
    assert step_cache.preset_for(a14b, two_experts=True) == "wan2.2-t2v-a14b"
    assert step_cache.preset_for(transformer_preset("I2V-A14B"), two_experts=True) == "wan2.2-i2v-a14b"
    assert step_cache.preset_for(transformer_preset("1.3B"), two_experts=True) is None
    experts = [0] * 16 + [1] * 24
    cache = step_cache.resolve(step_cache.CacheConfig("magcache"), a14b, 40, True, experts)
    assert cache.source.startswith("preset wan2.2-t2v-a14b")
    curve = cache.curves["cond"]
    for a, b in step_cache.expert_segments(experts):
        expected = step_cache.mag_schedule(curve[a:b], b - a, 0.06, 2, 0.4)
        np.testing.assert_array_equal(cache.schedule[a:b, 0], expected)
        assert cache.schedule[a, 0]  # each expert's first step computes
    assert step_cache.expert_segments([0, 0, 1]) == [(0, 2), (2, 3)]
    assert step_cache.expert_segments([0, 0]) == [(0, 2)]
