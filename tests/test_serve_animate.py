"""``wanjax serve --model demo-animate``: Animate's uploads (the pose, face, background and mask videos;
the character as ``image``) and values (``mode``, the segments) as request fields, checked before the
job is queued with the command line's checks (one 400 sentence naming the API's field), and a job's
video the one ``wanjax generate`` makes from the same files and values."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from helpers.serve_process import TERMINATED, Server, multipart
from PIL import Image
from test_serve import generate_in_a_process
from test_serve_uploads import NOT_A_VIDEO, TEXT, engines, png  # noqa: F401 (engines: a fixture)

from wanjax.io.video import write_mp4
from wanjax.io.video_reader import read_frames
from wanjax.server.errors import ApiError

FRAMES, FPS = 9, 16.0
WHOLE_VIDEO = {"prompt": "a dancer", "size": "48x32"}  # frames: the pose video's
JOB = {**WHOLE_VIDEO, "frames": FRAMES}
NOT_ANIMATE = (
    "mode, pose_video, face_video, background_video, mask_video, segment_frame_length and "
    "prev_segment_conditioning_frames are for an Animate model"
)


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
            "face_video",
        ),
        (
            "demo-animate",
            ("image", "pose_video", "face_video", "background_video"),
            {"mode": "replace"},
            "replace mode needs a background video and a mask video (background_video, mask_video)",
            "mask_video",
        ),
        (
            "demo-animate",
            ("image", "pose_video", "face_video"),
            {"mode": "replace"},
            "replace mode needs a background video and a mask video (background_video, mask_video)",
            "background_video",
        ),
        (
            "demo-animate",
            ("image", "pose_video", "face_video", "mask_video"),
            {},
            "a background and a mask video are for replace mode (mode replace)",
            "mask_video",
        ),
        (
            "demo-animate",
            ("image", "face_video"),
            {},
            "an Animate model needs the character image and a pose video (image, pose_video)",
            "pose_video",
        ),
        (
            "demo-animate",
            ("pose_video", "face_video"),
            {},
            "demo-animate is an image-to-video model: give the first frame with image",
            "image",
        ),
        (
            "demo-animate",
            ("image", "face_video"),
            {"pose_video": TEXT},
            f"pose_video: {NOT_A_VIDEO}; send the pose video as a video file",
            "pose_video",
        ),
        (
            "demo-animate",
            ("image", "pose_video"),
            {"face_video": TEXT},
            f"face_video: {NOT_A_VIDEO}; send the face video as a video file",
            "face_video",
        ),
        (
            "demo-animate",
            ("image", "pose_video", "face_video"),
            {"frames": 17},
            f"pose_video gives {FRAMES} frames at {FPS:g} fps, fewer than the 17 asked for (frames): ask for "
            f"{FRAMES} or fewer",
            "pose_video",
        ),
        (
            "demo-animate",
            ("image", "pose_video", "face_video"),
            {"frames": 1},
            "pose_video: the pose video needs more than 1 frames, got 1",
            "pose_video",
        ),
        (
            "demo-animate",
            ("image", "pose_video", "face_video"),
            {"prev_segment_conditioning_frames": 3},
            "segment_frame_length/prev_segment_conditioning_frames: prev_segment_conditioning_frames must be "
            "1 or 5, got 3",
            "prev_segment_conditioning_frames",
        ),
        (
            "demo-animate",
            ("image", "pose_video", "face_video"),
            {"prev_segment_conditioning_frames": 5},  # the model's segments of 9 frames are too short for it
            "segment_frame_length/prev_segment_conditioning_frames: segment_frame_length 9 must be more than "
            "twice prev_segment_conditioning_frames 5",
            "prev_segment_conditioning_frames",
        ),
        (
            "demo-animate",
            ("image", "pose_video", "face_video"),
            {"segment_frame_length": 5, "prev_segment_conditioning_frames": 5},
            "segment_frame_length/prev_segment_conditioning_frames: segment_frame_length 5 must be more than "
            "twice prev_segment_conditioning_frames 5",
            "segment_frame_length",
        ),
        (
            "demo",
            ("face_video",),
            {},
            f"{NOT_ANIMATE}; demo is not one",
            "face_video",
        ),
        (
            "demo",
            (),
            {"segment_frame_length": 9},
            f"{NOT_ANIMATE}; demo is not one",
            "segment_frame_length",
        ),
        (
            "demo",
            (),
            {"mode": "animate"},
            f"{NOT_ANIMATE}; demo is not one",
            "mode",
        ),
    ],
    ids=[
        "no-face-video",
        "replace-without-mask",
        "replace-without-background",
        "mask-in-animate-mode",
        "no-pose-video",
        "no-image",
        "text-as-pose-video",
        "text-as-face-video",
        "short-pose-video",
        "one-frame-pose-video",
        "bad-prev-segment-frames",
        "prev-segment-frames-too-many-for-the-segments",
        "short-segments",
        "plain-model-face-video",
        "plain-model-segment-length",
        "plain-model-mode",
    ],
)
def test_animate_inputs_are_checked_before_queueing(engines, videos, model, given, extra, message, param):  # noqa: F811
    """Each refusal's ``param`` is the field it is about: the one sent (a field another model does not
    take, a value out of range) or the one missing."""
    engine = engines(model)
    body = {**JOB, **{name: b64(videos[name]) for name in given}, **extra}
    with pytest.raises(ApiError) as refused:
        engine.accept("job", body)
    error = refused.value
    assert (error.status, error.message, error.param) == (400, message, param)
    assert "--" not in error.message and str(engine.inputs) not in error.message
    assert not list(engine.inputs.glob("*"))  # nothing kept


def test_a_job_without_frames_is_the_whole_pose_video(engines, videos, tmp_path):  # noqa: F811
    """As ``generate`` without ``--frames``: the pose video's frames (not the model's default), up
    to the server's limit; a longer pose video is refused naming the frames to ask for."""
    engine = engines("demo-animate")
    body = {
        "prompt": "a dancer",
        "size": "48x32",
        **{n: b64(videos[n]) for n in ("image", "pose_video", "face_video")},
    }
    params = engine.accept("whole", body)
    engine.remove_files("whole")
    assert params["frames"] == FRAMES != engine.defaults.frames
    limit = engine.limits.max_frames
    rng = np.random.default_rng(1)
    long = write_mp4(
        rng.integers(0, 256, (limit + 4, 40, 56, 3), dtype=np.uint8), tmp_path / "long.mp4", fps=FPS
    )
    with pytest.raises(ApiError) as refused:
        engine.accept("long", {**body, "pose_video": b64(long)})
    error = refused.value
    assert (error.status, error.param) == (400, "pose_video")
    assert error.message == (
        f"pose_video gives more than {limit} frames at {FPS:g} fps, over this server's limit of {limit}: "
        f"send frames (at most {limit}: the pose video's first frames) or a shorter pose video"
    )
    assert not list(engine.inputs.glob("*"))
    assert engine.accept("first", {**body, "pose_video": b64(long), "frames": limit})["frames"] == limit
    engine.remove_files("first")


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
    """A demo-animate server's job (animate mode, 2 steps, no ``frames``) makes the frames ``generate``
    makes from the same files and values: the whole pose video, the job's ``frames``."""
    server = Server(tmp_path / "serve", model="demo-animate", env={"WANJAX_CACHE": str(demo_env)}).start()
    try:
        uploads = {name: b64(videos[name]) for name in ("image", "pose_video", "face_video")}
        fields = {**WHOLE_VIDEO, "num_inference_steps": 2, "seed": 3, "mode": "animate"}
        job = server.wait(server.submit(**fields, **uploads)["id"], timeout=600)
        assert (job["pose_video"], job["face_video"], job["mask_video"], job["mode"], job["frames"]) == (
            True,
            True,
            False,
            "animate",
            FRAMES,
        )
        _, sheet, _ = server.request("GET", f"/v1/videos/{job['id']}/content?variant=spritesheet")
        _, video, _ = server.request("GET", f"/v1/videos/{job['id']}/content")
    finally:
        assert server.stop() == TERMINATED, server.stderr
    (tmp_path / "job.mp4").write_bytes(video)
    assert len(read_frames(tmp_path / "job.mp4", FPS, 1000)) == FRAMES
    args = ["--prompt", "a dancer", "--num_inference_steps", "2", "--seed", "3", "--mode", "animate"]
    args += ["--width", "48", "--height", "32", "--image", str(videos["image"])]
    args += ["--pose_video", str(videos["pose_video"]), "--face_video", str(videos["face_video"])]
    args += ["--preview", str(tmp_path / "cli.png"), "--output_video", str(tmp_path / "cli.mp4")]
    assert generate_in_a_process("--model", "demo-animate", *args) == 0
    (tmp_path / "job.png").write_bytes(sheet)
    np.testing.assert_array_equal(
        np.asarray(Image.open(tmp_path / "job.png")), np.asarray(Image.open(tmp_path / "cli.png"))
    )


@pytest.mark.slow
def test_animate_uploads_as_multipart_files_make_the_json_jobs_video(demo_env, videos, tmp_path):
    """The character and all four videos (replace mode) sent as ``multipart/form-data`` files, the
    values as form text, make the video the same job sent as base64 JSON makes."""
    names = ("image", "pose_video", "face_video", "background_video", "mask_video")
    values = {**JOB, "num_inference_steps": 2, "seed": 5, "mode": "replace", "segment_frame_length": 5}
    server = Server(tmp_path / "serve", model="demo-animate", env={"WANJAX_CACHE": str(demo_env)}).start()
    try:
        as_json = server.submit(**values, **{name: b64(videos[name]) for name in names})
        files = {name: (videos[name].name, videos[name].read_bytes()) for name in names}
        form, headers = multipart(**{name: str(value) for name, value in values.items()}, **files)
        status, as_form, _ = server.request("POST", "/v1/videos", raw=form, headers=headers)
        assert status == 202, as_form
        sheets = []
        for sent in (as_json, as_form):
            job = server.wait(sent["id"], timeout=600)
            assert all(job[name] for name in names) and (job["mode"], job["segment_frame_length"]) == (
                "replace",
                5,
            )
            _, sheet, _ = server.request("GET", f"/v1/videos/{job['id']}/content?variant=spritesheet")
            sheets.append(np.asarray(Image.open(io.BytesIO(sheet))))
    finally:
        assert server.stop() == TERMINATED, server.stderr
    np.testing.assert_array_equal(sheets[1], sheets[0])
