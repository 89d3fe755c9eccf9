"""``wanjax serve --model demo-animate``: Animate's uploads (the pose, face, background and mask videos;
the character as ``image``) and values (``mode``, the segments) as request fields, checked before the
job is queued with the command line's checks (one 400 sentence naming the API's field), and a job's
video the one ``wanjax generate`` makes from the same files and values."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from helpers.serve_process import TERMINATED, Server
from PIL import Image
from test_serve import generate_in_a_process
from test_serve_uploads import NOT_A_VIDEO, TEXT, engines, png  # noqa: F401 (engines: a fixture)

from wanjax.io.video import write_mp4
from wanjax.server.errors import ApiError

FRAMES, FPS = 9, 16.0
JOB = {"prompt": "a dancer", "size": "48x32", "frames": FRAMES}


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    """Each Animate video (as in tests/test_animate_cli.py) and the character, by field, as files."""
    folder = tmp_path_factory.mktemp("animate_uploads")
    rng = np.random.default_rng(0)
    paths = {}
    for name, shape in (("pose", (40, 56)), ("face", (24, 24)), ("background", (40, 56)), ("mask", (40, 56))):
        frames = rng.integers(0, 256, (FRAMES, *shape, 3), dtype=np.uint8)
        paths[f"{name}_video"] = write_mp4(frames, folder / f"{name}.mp4", fps=FPS)
    paths["image"] = folder / "character.png"
    Image.fromarray(rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)).save(paths["image"])
    return paths


def b64(path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


@pytest.mark.parametrize(
    ("model", "given", "extra", "message", "param"),
    [
        (
            "demo-animate",
            ("image", "pose_video"),
            {},
            "an Animate model needs a face video (face_video) beside the pose video",
            None,
        ),
        (
            "demo-animate",
            ("image", "pose_video", "face_video", "background_video"),
            {"mode": "replace"},
            "replace mode needs a background video and a mask video (background_video, mask_video)",
            None,
        ),
        (
            "demo-animate",
            ("image", "face_video"),
            {"pose_video": TEXT},
            f"pose_video: {NOT_A_VIDEO}; send the pose video as a video file",
            "pose_video",
        ),
        (
            "demo",
            ("face_video",),
            {},
            "mode, pose_video, face_video, background_video, mask_video, segment_frame_length and "
            "prev_segment_conditioning_frames are for an Animate model; demo is not one",
            "mode",
        ),
    ],
    ids=["no-face-video", "replace-without-mask", "text-as-pose-video", "plain-model"],
)
def test_animate_inputs_are_checked_before_queueing(engines, videos, model, given, extra, message, param):  # noqa: F811
    engine = engines(model)
    body = {**JOB, **{name: b64(videos[name]) for name in given}, **extra}
    with pytest.raises(ApiError) as refused:
        engine.accept("job", body)
    error = refused.value
    assert (error.status, error.message, error.param) == (400, message, param)
    assert "--" not in error.message and str(engine.inputs) not in error.message
    assert not list(engine.inputs.glob("*"))  # nothing kept


def test_an_animate_server_says_which_uploads_it_takes(engines):  # noqa: F811
    inputs = engines("demo-animate").image_inputs()
    assert {name: inputs[name] for name in ("image", "pose_video", "face_video", "background_video")} == {
        "image": "required",
        "pose_video": "required",
        "face_video": "required",
        "background_video": "optional",
    }
    assert engines("demo").image_inputs()["pose_video"] == "none"


@pytest.mark.slow
def test_an_animate_job_is_the_generate_run(demo_env, videos, tmp_path):
    """A demo-animate server's job (animate mode, 2 steps) makes the frames ``generate`` makes from the
    same files and values."""
    server = Server(tmp_path / "serve", model="demo-animate", env={"WANJAX_CACHE": str(demo_env)}).start()
    try:
        uploads = {name: b64(videos[name]) for name in ("image", "pose_video", "face_video")}
        fields = {**JOB, "num_inference_steps": 2, "seed": 3, "mode": "animate"}
        job = server.wait(server.submit(**fields, **uploads)["id"], timeout=600)
        assert (job["pose_video"], job["face_video"], job["mask_video"], job["mode"]) == (
            True,
            True,
            False,
            "animate",
        )
        _, sheet, _ = server.request("GET", f"/v1/videos/{job['id']}/content?variant=spritesheet")
    finally:
        assert server.stop() == TERMINATED, server.stderr
    args = ["--prompt", "a dancer", "--num_inference_steps", "2", "--seed", "3", "--mode", "animate"]
    args += ["--frames", str(FRAMES), "--width", "48", "--height", "32", "--image", str(videos["image"])]
    args += ["--pose_video", str(videos["pose_video"]), "--face_video", str(videos["face_video"])]
    args += ["--preview", str(tmp_path / "cli.png"), "--output_video", str(tmp_path / "cli.mp4")]
    assert generate_in_a_process("--model", "demo-animate", *args) == 0
    (tmp_path / "job.png").write_bytes(sheet)
    np.testing.assert_array_equal(
        np.asarray(Image.open(tmp_path / "job.png")), np.asarray(Image.open(tmp_path / "cli.png"))
    )
