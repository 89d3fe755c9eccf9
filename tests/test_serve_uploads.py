"""Uploads ``wanjax serve`` cannot use (a text file sent as an image, a video or a mask, an image too
small): one 400 sentence naming the API's field, what is wrong and what to send, never the CLI's
flags or the server's files. Read by the engine of a server of each demo model, in this process
(its checks read no weight)."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from wanjax.jobs.groups import CommonFlags
from wanjax.jobs.opening import defaults_of, mesh_request, open_pipeline
from wanjax.server.api import Limits
from wanjax.server.engine import Engine
from wanjax.server.errors import ApiError
from wanjax.server.request import ServeRequest, ServerFlags

TEXT = base64.b64encode(b"a text file, not a picture\n").decode()
NOT_AN_IMAGE = "not an image Pillow can read (PNG, JPEG, WebP, ...)"
NOT_A_VIDEO = "not a video PyAV can read (MP4, WebM, MOV, ...)"


def png(width: int, height: int) -> str:
    data = io.BytesIO()
    Image.new("RGB", (width, height), (90, 120, 150)).save(data, format="PNG")
    return base64.b64encode(data.getvalue()).decode()


@pytest.fixture(scope="module")
def engines(demo_env, tmp_path_factory):
    """The engine of a server of a demo model, by name (made once)."""
    made: dict[str, Engine] = {}

    def engine(model: str) -> Engine:
        if model not in made:
            out = tmp_path_factory.mktemp("serve")
            request = ServeRequest(common=CommonFlags(model=model), server=ServerFlags(output_dir=str(out)))
            mesh, fsdp = mesh_request(request.parallel)
            pipe = open_pipeline(request.job_base(), mesh, fsdp)
            d = defaults_of(pipe)
            made[model] = Engine(
                pipe, request.job_base(), mesh, out, Limits(d.frames, d.height * d.width, 100, 8, 2**24)
            )
        return made[model]

    return engine


@pytest.mark.parametrize(
    ("model", "fields", "message"),
    [
        ("demo-i2v", {"image": TEXT}, f"image: {NOT_AN_IMAGE}; send the first frame as an image file"),
        (
            "demo-i2v-a14b",
            {"image": png(192, 128), "last_image": TEXT},
            f"last_image: {NOT_AN_IMAGE}; send the last frame as an image file",
        ),
        ("demo", {"video": TEXT}, f"video: {NOT_A_VIDEO}; send the video to re-make as a video file"),
        ("demo-vace", {"video": TEXT}, f"video: {NOT_A_VIDEO}; send the control video as a video file"),
        (
            "demo-vace",
            {"mask": TEXT},
            f"mask: neither {NOT_AN_IMAGE.removeprefix('not ')} nor {NOT_A_VIDEO.removeprefix('not ')}; "
            "send the mask as an image or a video file",
        ),
        (
            "demo-vace",
            {"reference_images": [png(32, 32), TEXT]},
            f"reference_images: image 2 of 2 is {NOT_AN_IMAGE}; send each reference image as an image file",
        ),
        (
            "demo",
            {"video": png(64, 64)},
            "video is an image (PNG), not a video: give a video file (mp4, webm, mov, ...)",
        ),  # a still is not a video: the rule the command line's --video follows
        (
            "demo-i2v",
            {"image": png(8, 8)},
            "image of 8x8 is too small: give one at least 16 pixels on each side",
        ),  # readable: the check's own message, the field named once
    ],
    ids=[
        "image",
        "last_image",
        "video",
        "vace-video",
        "mask",
        "reference_images",
        "image-as-video",
        "small-image",
    ],
)
def test_an_upload_it_cannot_use_is_one_sentence_naming_its_field(engines, model, fields, message):
    engine = engines(model)
    with pytest.raises(ApiError) as refused:
        engine.accept("job", {"prompt": "a cat", "size": "192x128", **fields})
    error = refused.value
    field = message.split()[0].rstrip(":")  # the field it starts with: the error's param
    assert (error.status, error.message, error.param) == (400, message, field)
    assert "--" not in error.message and str(engine.inputs) not in error.message
    assert not list(engine.inputs.glob("*"))  # nothing kept
