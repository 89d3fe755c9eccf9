"""Wan 2.2 Animate against diffusers' ``WanAnimatePipeline`` on a tiny random pipeline saved with
``save_pretrained``: both modes (animate; replace, with a background and a mask), two segments (the
second continuing from the first's last frame), guidance: the same inputs and noise (diffusers' second
segment's draw is ours, through its ``randn_tensor``) give diffusers' last latents (float32) and its
frames."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.compare import relative_error, to_uint8
from helpers.models import randomize_
from helpers.pipelines import NEGATIVE, PROMPT, branch_decisions, save_tiny, tiny_components
from PIL import Image
from test_animate_transformer import ANIMATE

from wanjax import WanPipeline
from wanjax.errors import WanjaxError
from wanjax.pipeline.animate import Segments, pad_frames

HEIGHT, WIDTH, STEPS, SEGMENT, FACE = 32, 48, 2, 5, 16
POSE_FRAMES = 8  # two segments of 5 frames, the second from the first's last: 9 covered, 8 kept


def build_animate(root, tokenizer_dir):
    """A tiny WanAnimatePipeline saved under ``root``; diffusers' copy read back from it."""
    from diffusers import WanAnimatePipeline, WanAnimateTransformer3DModel
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    vision = CLIPVisionConfig(
        hidden_size=20, intermediate_size=24, num_hidden_layers=3, num_attention_heads=4, image_size=28,
        patch_size=14, hidden_act="gelu",
    )  # fmt: skip
    components = tiny_components(tokenizer_dir)
    transformer = randomize_(WanAnimateTransformer3DModel(**{**ANIMATE, "text_dim": 24}), seed=2, std=0.2)
    randomize_(transformer.motion_encoder, seed=7, std=1.0)  # as the transformer test: the face matters
    components["transformer"] = transformer.eval()
    pipe = WanAnimatePipeline(
        **components,
        image_encoder=randomize_(CLIPVisionModel(vision), seed=5, std=0.2).eval(),
        image_processor=CLIPImageProcessor(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}),
    )
    save_tiny(pipe, root, tokenizer_dir)
    return WanAnimatePipeline.from_pretrained(root)


def frames_of(rng, count, shape, gray=False):
    if gray:  # a mask: white (replace) and black (keep) regions, and grays between
        return [
            Image.fromarray(rng.integers(0, 256, shape[:2], dtype=np.uint8)).convert("RGB")
            for _ in range(count)
        ]
    return [Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)) for _ in range(count)]


def animate_setup(tmp_path_factory, tokenizer_dir):
    """The tiny pipeline's folder, diffusers' copy of it, and the inputs (the image and four videos)."""
    root = tmp_path_factory.mktemp("wan_animate")
    reference = build_animate(root, tokenizer_dir)
    rng = np.random.default_rng(0)
    inputs = {
        "image": Image.fromarray(rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)),
        "pose_video": frames_of(rng, POSE_FRAMES, (40, 56, 3)),
        "face_video": frames_of(rng, POSE_FRAMES, (20, 18, 3)),
        "background_video": frames_of(rng, POSE_FRAMES, (40, 56, 3)),
        "mask_video": frames_of(rng, POSE_FRAMES, (40, 56, 3), gray=True),
    }
    return root, reference, inputs


@pytest.fixture(scope="module")
def animate(tmp_path_factory, tokenizer_dir):
    return animate_setup(tmp_path_factory, tokenizer_dir)


def our_run(pipe, videos, mode, first, steps=STEPS, **options):
    """wanjax's run of ``pipe`` at this module's shape and values (guidance 5, seed 11), the first
    segment from ``first``."""
    return pipe(
        PROMPT,
        NEGATIVE,
        **videos,
        mode=mode,
        height=HEIGHT,
        width=WIDTH,
        segment_frame_length=SEGMENT,
        prev_segment_conditioning_frames=1,
        num_inference_steps=steps,
        guidance_scale=5.0,
        seed=11,
        latents=np.asarray(first),
        progress=False,
        **options,
    )


def diffusers_run(pipe, inputs, mode, first_noise, second_noise, monkeypatch, steps=STEPS, cache=None):
    """diffusers' run: its frames (uint8), the last segment's last latents and, with a ``cache``
    config enabled on its transformer, each step's per-branch decisions (every segment's in turn);
    its second segment's noise is ``second_noise`` (its ``randn_tensor`` patched)."""
    import diffusers.pipelines.wan.pipeline_wan_animate as module

    draws = iter([second_noise])
    monkeypatch.setattr(module, "randn_tensor", lambda shape, **kw: next(draws).reshape(shape).clone())
    final, decisions = [], []

    def on_step(p, i, t, kw):
        final.append(kw["latents"].clone())
        if cache is not None:
            decisions.append(branch_decisions(p.transformer, "taylorseer"))
        return {}

    videos = (
        dict(inputs)
        if mode == "replace"
        else {k: v for k, v in inputs.items() if "background" not in k and "mask" not in k}
    )
    if cache is not None:
        pipe.transformer.enable_cache(cache)
    try:
        with torch.no_grad():
            video = pipe(
                **videos,
                prompt=PROMPT,
                negative_prompt=NEGATIVE,
                height=HEIGHT,
                width=WIDTH,
                segment_frame_length=SEGMENT,
                num_inference_steps=steps,
                mode=mode,
                prev_segment_conditioning_frames=1,
                guidance_scale=5.0,
                latents=first_noise,
                output_type="np",
                callback_on_step_end=on_step,
            ).frames
    finally:
        if cache is not None:
            pipe.transformer.disable_cache()
    computed = {name: [d[name] for d in decisions] for name in ("cond", "uncond")}
    return to_uint8(video), final[-1].numpy(), computed


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["animate", "replace"])
def test_animate_equals_diffusers(animate, mode, monkeypatch):
    root, reference, inputs = animate
    pipe = WanPipeline.from_pretrained(root, dtype="float32", jax_cache_dir=False)
    frames_in_segment = SEGMENT + 4  # a latent frame more: the reference's
    first = pipe.prepare_latents(1, HEIGHT, WIDTH, frames_in_segment, seed=11)
    second = pipe.prepare_latents(1, HEIGHT, WIDTH, frames_in_segment, seed=11, segment=1)
    frames_ref, latents_ref, _ = diffusers_run(
        reference,
        inputs,
        mode,
        torch.from_numpy(np.array(first)),
        torch.from_numpy(np.array(second)),
        monkeypatch,
    )
    videos = (
        inputs
        if mode == "replace"
        else {k: v for k, v in inputs.items() if "background" not in k and "mask" not in k}
    )
    out = our_run(pipe, videos, mode, first)
    assert out.frames.shape == frames_ref.shape == (1, POSE_FRAMES, HEIGHT, WIDTH, 3)
    error = relative_error(out.denoised.latents, latents_ref)
    levels = int(np.abs(out.frames.astype(np.int16) - frames_ref).max())
    print(f"{mode}: last latents relative error {error:.2e}, frames within {levels} levels")
    assert error <= 1e-4
    assert levels <= 2


def test_segments_and_padding_are_diffusers():
    """The segment count and covered frames of diffusers' loop, and its reflecting padding."""
    assert pad_frames([1, 2, 3, 4, 5], 10) == [1, 2, 3, 4, 5, 4, 3, 2, 1, 2]
    s = Segments.of(8, 5, 1, 4)
    assert (s.step, s.count, s.covered) == (4, 2, 9)
    s = Segments.of(77, 77, 1, 4)
    assert (s.count, s.covered) == (1, 77)
    s = Segments.of(150, 78, 5, 4)  # 78 frames: 77 (4n + 1)
    assert (s.length, s.step, s.count, s.covered) == (77, 72, 3, 221)
    with pytest.raises(WanjaxError, match="1 or 5"):
        Segments.of(80, 77, 3, 4)


def test_bad_inputs_are_one_line_errors(animate):
    root, _, inputs = animate
    pipe = WanPipeline.from_pretrained(root, dtype="float32", jax_cache_dir=False)
    run = dict(
        height=HEIGHT, width=WIDTH, segment_frame_length=SEGMENT, num_inference_steps=1, progress=False
    )
    with pytest.raises(WanjaxError, match="needs a face video"):
        pipe(PROMPT, image=inputs["image"], pose_video=inputs["pose_video"], **run)
    with pytest.raises(WanjaxError, match="replace mode needs a background video and a mask video"):
        pipe(
            PROMPT,
            image=inputs["image"],
            pose_video=inputs["pose_video"],
            face_video=inputs["face_video"],
            mode="replace",
            **run,
        )
    with pytest.raises(WanjaxError, match="fewer than the 12 asked for"):
        pipe(
            PROMPT,
            image=inputs["image"],
            pose_video=inputs["pose_video"],
            face_video=inputs["face_video"],
            num_frames=12,
            **run,
        )


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["dp=2,sp=2,tp=2", "dp=1,sp=8,tp=1"])
def test_animate_on_a_mesh_equals_one_device(animate, mesh):
    """Replace mode, two segments, guidance, float32 on 8 devices: the one-device run (the face
    adapters' per-frame attention on tokens split over sp, heads over tp)."""
    root, _, inputs = animate
    kwargs = dict(
        mode="replace", height=HEIGHT, width=WIDTH, segment_frame_length=SEGMENT, num_inference_steps=STEPS,
        guidance_scale=5.0, seed=3, progress=False, **inputs,
    )  # fmt: skip
    alone = WanPipeline.from_pretrained(root, dtype="float32", jax_cache_dir=False)(
        PROMPT, NEGATIVE, **kwargs
    )
    sharded = WanPipeline.from_pretrained(root, dtype="float32", jax_cache_dir=False, mesh=mesh)(
        PROMPT, NEGATIVE, **kwargs
    )
    error = relative_error(sharded.denoised.latents, alone.denoised.latents)
    levels = int(np.abs(sharded.frames.astype(np.int16) - alone.frames).max())
    print(f"{mesh}: last latents relative error {error:.2e}, frames within {levels} levels")
    assert error <= 1e-5
    assert levels <= 1
