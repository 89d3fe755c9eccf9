"""The three stages on an Animate model (demo-animate): ``encode`` stores what no segment changes,
``denoise`` runs the segments (the VAE decoding each one's last frames for the next), ``decode``
decodes and joins them: ``generate``'s frames bit for bit, in both modes; stage directories and
starting latents that do not fit are one-line errors naming the fix, before any work."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers.animate_inputs import write_animate_inputs
from safetensors.numpy import save_file

from wanjax.cli.main import main
from wanjax.io.checkpoint import open_safetensors
from wanjax.pipeline import stages

SIZE = ("--height", "32", "--width", "48")
MODEL = ("--model", "demo-animate", "--dtype", "float32", "--quiet")
SAMPLING = ("--num_inference_steps", "2", "--seed", "5")


@pytest.fixture(scope="module")
def files(tmp_path_factory, demo_env):
    return write_animate_inputs(tmp_path_factory.mktemp("animate_inputs"))


def inputs(files, mode: str = "animate") -> list[str]:
    flags = ["--prompt", "a dancer", "--image", str(files["image"]), "--mode", mode]
    flags += ["--pose_video", str(files["pose"]), "--face_video", str(files["face"]), "--fps", "16"]
    if mode == "replace":
        flags += ["--background_video", str(files["background"]), "--mask_video", str(files["mask"])]
    return flags


@pytest.fixture(scope="module")
def encoded(files, tmp_path_factory):
    """A stage directory encoded for demo-animate (animate mode)."""
    directory = tmp_path_factory.mktemp("animate_stage")
    assert main(["encode", *MODEL, *inputs(files), *SIZE, "--output_dir", str(directory)]) == 0
    return directory


def one_line(capsys, argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


TAYLORSEER = (
    "--cache",
    "taylorseer",
    "--cache_option",
    "use_lite_mode=true",
    "--cache_option",
    "cache_interval=2",
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "cache", "prompts"),
    [("animate", (), 1), ("replace", (), 2), ("animate", TAYLORSEER, 1)],
    ids=["animate", "replace-two-prompts", "taylorseer"],
)
def test_the_three_stages_are_generate(files, mode, cache, prompts, tmp_path):
    """Two segments (the second conditioned on the first's decoded frames), the first from
    ``--init_latents`` in animate mode, two prompts (a video each) in replace mode: ``encode | denoise |
    decode`` writes ``generate``'s frames; with TaylorSeer, denoise carries its state from segment to
    segment as generate does."""
    init = []
    if mode == "animate":  # [1, 16, (9 frames' 3 latent frames) + the reference's, 32/8, 48/8]
        noise = np.random.default_rng(1).standard_normal((1, 16, 4, 4, 6)).astype(np.float32)
        save_file({"latents": noise}, str(tmp_path / "noise.safetensors"))
        init = ["--init_latents", str(tmp_path / "noise.safetensors")]
    made = tmp_path / "generate.npy"
    given = [*inputs(files, mode), *["--prompt", "a robot"] * (prompts - 1)]  # one video per prompt
    argv = [*MODEL, *given, *SIZE, *SAMPLING, *init, *cache]
    out = ["--output_video", str(tmp_path / "g.mp4"), "--frames_out", str(made)]
    assert main(["generate", *argv, *out]) == 0
    d = tmp_path / "stages"
    assert main(["encode", *MODEL, *given, *SIZE, "--output_dir", str(d)]) == 0
    videos = stages.load_animate(d).videos
    assert videos.segments.count == 2 and (videos.mask is not None) == (mode == "replace")
    assert main(["denoise", "--input_dir", str(d), "--quiet", *SAMPLING, *init, *cache]) == 0
    if cache:  # hook calls 0..3 over the two segments; the first 3 compute (disable_cache_before_step),
        # so only a state carried into the second segment predicts its last step
        record = json.loads((tmp_path / "g.json").read_text())["cache"]
        assert record["branches"]["cond"]["skipped"] == [3]
    latents = stages.load_latents(d / stages.LATENTS_FILE)
    assert latents.shape == (prompts, 16, 8, 4, 6)  # two segments of 4 latent frames
    assert main(["decode", "--input_dir", str(d), "--frames_out", str(d / "f.npy"), "--quiet"]) == 0
    ours, expected = np.load(d / "f.npy"), np.load(made)
    assert ours.shape == (prompts, 12, 32, 48, 3)
    np.testing.assert_array_equal(ours, expected)


def test_encode_stores_the_animate_inputs(encoded, files):
    """What no segment changes: the prepared frames over the frames the segments cover (stored as
    uint8, read back to the prepared float32 bits), the character's states and reference latents,
    the segments; no background or mask in animate mode."""
    from wanjax.pipeline.animate import prepare_videos, read_inputs

    assert open_safetensors(encoded / stages.ANIMATE_FILE)["pose_video"].array().dtype == np.uint8
    conditioning = stages.load_animate(encoded)
    videos = conditioning.videos
    read = read_inputs(str(files["pose"]), str(files["face"]), None, None, "animate", None, 16.0)
    prepared = prepare_videos(read, 32, 48, videos.face.shape[2], videos.segments)
    np.testing.assert_array_equal(videos.pose, prepared.pose)
    np.testing.assert_array_equal(videos.face, prepared.face)
    assert (videos.segments.frames, videos.segments.length, videos.segments.overlap) == (12, 9, 1)
    assert videos.pose.shape == (3, 17, 32, 48) and videos.face.shape[:2] == (3, 17)
    assert videos.background is None and videos.mask is None
    assert conditioning.reference.shape == (1, 4 + 16, 1, 4, 6)
    assert not (encoded / stages.IMAGE_FILE).exists()


def test_encode_checks_the_inputs_as_generate(files, capsys, tmp_path):
    """generate's checks, one line, nothing written."""
    out = tmp_path / "refused"
    base = ["encode", *MODEL, "--prompt", "x", "--image", str(files["image"]), "--output_dir", str(out)]
    line = one_line(capsys, [*base, "--pose_video", str(files["pose"])])
    assert "needs a face video (--face_video)" in line
    line = one_line(capsys, [*base, "--pose_video", str(files["pose"]), "--face_video", str(files["face"]), "--frames", "40"])  # fmt: skip
    assert "--pose_video gives 12 frames at 16 fps, fewer than the 40 asked for" in line
    line = one_line(capsys, ["encode", "--model", "demo", "--prompt", "x", "--pose_video", str(files["pose"]), "--output_dir", str(out)])  # fmt: skip
    assert "are for an Animate model" in line
    assert not out.exists() or not any(out.iterdir())


def test_denoise_refuses_a_stage_directory_of_another_model(encoded, capsys, tmp_path):
    """An Animate model's inputs given to another model, and the other way round; starting latents
    of another shape: one line naming the fix."""
    line = one_line(capsys, ["denoise", "--input_dir", str(encoded), "--model", "demo", "--quiet"])
    assert "an Animate model's inputs, but demo is not one; denoise with the Animate model" in line
    plain = tmp_path / "plain"
    assert main(["encode", "--model", "demo", "--prompt", "x", "--output_dir", str(plain), "--quiet"]) == 0
    line = one_line(capsys, ["denoise", "--input_dir", str(plain), "--model", "demo-animate", "--quiet"])
    assert f"no {stages.ANIMATE_FILE}, and demo-animate is an Animate model; run `wanjax encode" in line
    line = one_line(capsys, ["denoise", "--input_dir", str(plain), "--vae_dtype", "bfloat16", "--quiet"])
    assert (
        "the VAE flags are for an Animate model's denoise" in line and "give them to `wanjax decode`" in line
    )
    save_file({"latents": np.zeros((1, 16, 3, 4, 6), np.float32)}, str(tmp_path / "short.safetensors"))
    argv = ["denoise", "--input_dir", str(encoded), "--init_latents", str(tmp_path / "short.safetensors")]
    line = one_line(capsys, [*argv, "--quiet"])
    assert (
        "--init_latents (1, 16, 3, 4, 6): an Animate run's first segment at 48x32 takes (1, 16, 4, 4, 6)"
        in line
    )
    assert "leave --init_latents out" in line
    assert not (encoded / stages.LATENTS_FILE).exists()


@pytest.mark.slow
def test_the_python_stages_are_the_call(files):
    """``prepare_animate`` (beside ``encode_prompt``), ``denoise_segments``, ``decode_segments``: the
    frames ``pipe(...)`` makes, bit for bit (replace mode)."""
    from wanjax import WanPipeline

    pipe = WanPipeline.from_pretrained("demo-animate", dtype="float32", jax_cache_dir=False)
    videos = {"pose_video": str(files["pose"]), "face_video": str(files["face"])}
    videos.update(background_video=str(files["background"]), mask_video=str(files["mask"]))
    values = dict(height=32, width=48, num_inference_steps=2, seed=5, mode="replace")
    whole = pipe("a dancer", image=str(files["image"]), **videos, **values, progress=False).frames
    pos, neg = pipe.encode_prompt("a dancer")
    inputs = pipe.prepare_animate(str(files["image"]), **videos, **values)
    denoised = pipe.denoise_segments(pos, neg, inputs, **values, progress=False)
    assert len(denoised) == inputs.videos.segments.count == 2
    frames = pipe.decode_segments(inputs.videos.segments, [d.latents for d in denoised])
    np.testing.assert_array_equal(frames, whole)


def test_damaged_animate_stage_files_are_one_line_errors(encoded, capsys, tmp_path):
    """A ``stage1_animate`` whose videos do not cover the segments' frames, and segment latents that
    do not split into their segments: one line naming the stage to re-run."""
    import shutil

    from safetensors.numpy import load_file

    d = tmp_path / "damaged"
    shutil.copytree(encoded, d)
    tensors = load_file(str(d / stages.ANIMATE_FILE))
    save_file({**tensors, "pose_video": tensors["pose_video"][:, :5]}, str(d / stages.ANIMATE_FILE))
    line = one_line(capsys, ["denoise", "--input_dir", str(d), "--quiet"])
    assert f"{stages.ANIMATE_FILE}: its videos" in line and "re-run `wanjax encode`" in line
    latents = np.zeros((1, 16, 7, 4, 6), np.float32)
    save_file({"latents": latents, "segments": np.asarray([12, 9, 1])}, str(d / stages.LATENTS_FILE))
    line = one_line(capsys, ["decode", "--input_dir", str(d), "--quiet"])
    assert "do not split into 2 segments; re-run `wanjax denoise`" in line


def test_the_stored_pixels_read_back_to_the_same_bits():
    """Every uint8 value: the frames' ``[-1, 1]`` and the mask's ``[0, 1]`` float32 values go to the
    stored pixels and back unchanged."""
    from wanjax.pipeline.animate import mask_pixels, mask_values
    from wanjax.pipeline.conditioning import signed_pixels, uint8_pixels

    every = np.arange(256, dtype=np.uint8)
    for to_float, to_pixels in ((signed_pixels, uint8_pixels), (mask_values, mask_pixels)):
        values = to_float(every)
        np.testing.assert_array_equal(to_pixels(values), every)
        assert to_float(to_pixels(values)).tobytes() == values.tobytes()


def test_the_python_stages_are_for_an_animate_model(files):
    from wanjax import WanPipeline
    from wanjax.errors import WanjaxError

    pipe = WanPipeline.from_pretrained("demo", dtype="float32", jax_cache_dir=False)
    with pytest.raises(WanjaxError, match="is not an Animate model"):
        pipe.prepare_animate(str(files["image"]), str(files["pose"]), str(files["face"]))


def test_decode_takes_the_vae_denoise_conditioned_with(encoded, capsys, tmp_path):
    """An Animate denoise decodes each segment's last frames with its VAE flags; decode with others
    would not make generate's video: one line naming the flag to give, nothing written."""
    import shutil

    d = tmp_path / "stage"
    shutil.copytree(encoded, d)
    assert main(["denoise", "--input_dir", str(d), "--quiet", *SAMPLING, "--vae_dtype", "bfloat16"]) == 0
    line = one_line(capsys, ["decode", "--input_dir", str(d), "--quiet", "--frames_out", str(d / "f.npy")])
    assert "--vae_dtype float32 differs from the VAE `wanjax denoise` decoded" in line
    assert "give --vae_dtype bfloat16 so the video is generate's" in line and not (d / "f.npy").exists()
    assert main(["decode", "--input_dir", str(d), "--quiet", "--vae_dtype", "bfloat16", "--frames_out", str(d / "f.npy")]) == 0  # fmt: skip
    assert np.load(d / "f.npy").shape == (1, 12, 32, 48, 3)
