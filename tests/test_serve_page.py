"""The web page of ``wanjax serve`` in real headless Chromium (selenium): a real server process with the demo
model, the form's defaults from ``/v1/server``, a server error shown in the page, one job submitted from the
form whose progress bar moves while the page polls, and its mp4 played by a <video> element (from a blob
fetched with the key header), then deleted from its card. A screenshot is kept as a test artefact
(``tmp_path/page.png``, copied to ``$WANJAX_ARTEFACTS`` when set)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from helpers.serve_process import Server
from test_serve_animate import FRAMES, b64, videos  # noqa: F401 (videos: a fixture)

pytestmark = pytest.mark.slow  # a server process and a browser

STEPS = 6
# libx264 with yuv420p writes High profile: a Chromium built without proprietary codecs answers "" here
H264 = 'video/mp4; codecs="avc1.64001E"'
HEADLESS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage")


def _browser_paths() -> tuple[str, str]:
    """Chromium and chromedriver (Debian's packages); skip without them, except in CI where they must be."""
    chromium = next(filter(None, map(shutil.which, ("/usr/bin/chromium", "chromium"))), None)
    driver = next(filter(None, map(shutil.which, ("/usr/bin/chromedriver", "chromedriver"))), None)
    missing = [name for name, path in (("chromium", chromium), ("chromedriver", driver)) if path is None]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip)")
    if missing:
        message = f"the page test needs {', '.join(missing)}: apt-get install chromium chromium-driver"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return chromium, driver


@pytest.fixture
def browser():
    chromium, driver_path = _browser_paths()
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = chromium  # with both paths given, Selenium Manager downloads nothing
    for arg in (*HEADLESS, "--window-size=1280,860"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def server(tmp_path, demo_env):
    """A ``wanjax serve --model demo`` process on a free port (no API key); yields its base URL."""
    server = Server(tmp_path / "serve", env={"WANJAX_CACHE": str(demo_env)}).start()
    try:
        yield server.url
    finally:
        server.stop()


def _wait(predicate, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


def _keep_screenshot(driver, tmp_path: Path, name: str = "serve_page.png") -> Path:
    shot = tmp_path / "page.png"
    driver.save_screenshot(str(shot))
    if os.environ.get("WANJAX_ARTEFACTS"):
        target = Path(os.environ["WANJAX_ARTEFACTS"])
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, target / name)
    return shot


def test_page_submits_a_job_shows_its_progress_and_plays_the_video(server, browser, tmp_path):
    from selenium.webdriver.common.by import By

    driver = browser
    driver.set_script_timeout(30)
    driver.get(server + "/")
    field = lambda name: driver.find_element(By.ID, name)  # noqa: E731
    info = json.load(urllib.request.urlopen(server + "/v1/server", timeout=10))
    try:
        # the form's defaults come from /v1/server
        _wait(lambda: field("num_inference_steps").get_attribute("value"), 30, "the defaults in the form")
        defaults = info["defaults"]
        assert field("size").get_attribute("value") == defaults["size"] == "192x128"
        assert field("frames").get_attribute("value") == str(defaults["frames"])
        assert field("num_inference_steps").get_attribute("value") == str(defaults["num_inference_steps"])
        assert field("seed").get_attribute("value") == str(defaults["seed"])

        # a request the server refuses: its error.message in #error, no job
        prompt = 'a <b>red</b> fox & "friends" <script>x()</script>'
        field("prompt").send_keys(prompt)
        field("num_inference_steps").clear()
        field("num_inference_steps").send_keys(str(info["limits"]["max_steps"] + 1))
        field("submit").click()
        message = _wait(lambda: field("error").text, 10, "the error message in #error")
        assert "\n" not in message and not driver.find_elements(By.CSS_SELECTOR, ".job")

        # a real job: the progress bar moves while the page polls
        field("num_inference_steps").clear()
        field("num_inference_steps").send_keys(str(STEPS))
        field("submit").click()
        card = _wait(lambda: driver.find_elements(By.CSS_SELECTOR, ".job[data-id]"), 10, "the job's card")[0]
        job_id = card.get_attribute("data-id")
        assert re.fullmatch(r"[0-9a-f]{32}", job_id), job_id
        assert field("error").text == ""
        read = f"""const card = document.querySelector('.job[data-id="{job_id}"]');
            return [card.className, card.querySelector('progress.progress').value,
                    card.querySelector('.stage').textContent];"""
        values, stages, deadline = [], set(), time.monotonic() + 90
        while time.monotonic() < deadline:
            classes, value, stage = driver.execute_script(read)
            if not values or values[-1] != value:
                values.append(value)
            stages.add(stage)
            if "completed" in classes.split() or "failed" in classes.split():
                break
            time.sleep(0.05)
        assert "completed" in classes.split(), (classes, card.find_element(By.CSS_SELECTOR, ".err").text)
        assert values == sorted(values) and values[-1] == 100, values  # never goes back
        assert any(0 < v < 100 for v in values), f"no progress between 0 and 100 was shown: {values}"
        assert any(re.search(rf"step \d+/{STEPS}\b", s) for s in stages), stages
        # the prompt as typed, as text (no markup from it)
        assert card.find_element(By.CSS_SELECTOR, ".prompt").text == prompt
        assert not card.find_elements(By.CSS_SELECTOR, ".prompt *")
        assert f"{STEPS} steps" in card.text and "192x128" in card.text

        # the newest completed job's video loads by itself, from a blob: URL
        player = f"document.querySelector('.job[data-id=\"{job_id}\"] video.player')"
        js = lambda code: driver.execute_script(f"const v = {player}; {code}")  # noqa: E731
        _wait(lambda: js("return v !== null"), 30, "the video.player element")
        src = js("return v.src")
        assert src.startswith("blob:"), src
        blob = driver.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            f"fetch({player}.src).then(r => r.blob()).then(b => done([b.type, b.size]), e => done(`${{e}}`));"
        )
        assert blob[0] == "video/mp4" and blob[1] > 0, blob
        if js(f"return v.canPlayType('{H264}')"):
            _wait(lambda: js("return v.readyState >= 1"), 20, "the video's metadata")
            state = js("return [v.videoWidth, v.videoHeight, v.error]")
            assert state == [192, 128, None], state
        else:  # a Chromium build without H.264: the blob's type and size above are what can be checked
            print(f"chromium cannot decode {H264}: the mp4 was checked as a blob only")
        _wait(lambda: js("return v.readyState >= 2 || v.error !== null"), 10, "a frame to show")
        assert js("return v.poster").startswith("blob:")  # the first frame (the WebP thumbnail)

        # the smoke model's banner, the model's size presets, a random seed
        assert field("smoke").is_displayed() and "smoke-test model" in field("smoke").text
        presets = driver.execute_script(
            "return [...document.querySelectorAll('#size_presets option')].map(o => o.value)"
        )
        assert presets == info["size_presets"] == ["192x128", "128x192", "144x144"]
        field("random_seed").click()
        assert field("seed").get_attribute("value") != str(info["defaults"]["seed"])
        assert 0 <= int(field("seed").get_attribute("value")) < 2**31

        # each waiting job's place and time, from the finished jobs' seconds per step and the running one's pace
        waiting = driver.execute_script(
            """return queueInfo([
                {id: "a", status: "completed", run_seconds: 10, steps: 5, created_at: 1},
                {id: "b", status: "in_progress", step: 2, steps: 4, started_at: 100, created_at: 2},
                {id: "c", status: "queued", steps: 3, created_at: 4},
                {id: "d", status: "queued", steps: 5, created_at: 3}], 110);"""
        )
        assert waiting == {"b": {"eta": 10}, "d": {"position": 1, "eta": 10}, "c": {"position": 2, "eta": 20}}

        # "Run again": the same values as a new job; "Remix": the finished video re-made with the form's prompt
        def listed():
            return json.load(urllib.request.urlopen(server + "/v1/videos", timeout=10))["data"]

        card.find_element(By.CSS_SELECTOR, "button.again").click()
        again = _wait(lambda: [j for j in listed() if j["id"] != job_id], 10, "the job run again")[0]
        first = next(j for j in listed() if j["id"] == job_id)
        keys = (
            "prompt",
            "negative_prompt",
            "size",
            "frames",
            "num_inference_steps",
            "guidance_scale",
            "seed",
        )
        assert {k: again[k] for k in keys} == {k: first[k] for k in keys}
        field("prompt").clear()
        field("prompt").send_keys("the same fox at night")
        card.find_element(By.CSS_SELECTOR, "button.remix").click()
        remixed = _wait(
            lambda: [j for j in listed() if j["remixed_from_video_id"] == job_id], 10, "the remix"
        )[0]
        assert (
            remixed["prompt"] == "the same fox at night" and remixed["video"] and remixed["size"] == "192x128"
        )
    except BaseException:  # the page as it was when the test failed
        with contextlib.suppress(Exception):
            _keep_screenshot(driver, tmp_path)
        raise
    assert _keep_screenshot(driver, tmp_path).stat().st_size > 0

    # its delete button removes the card and the job
    card.find_element(By.CSS_SELECTOR, "button.del").click()
    cards = lambda: driver.find_elements(By.CSS_SELECTOR, f'.job[data-id="{job_id}"]')  # noqa: E731
    _wait(lambda: not cards(), 10, "the card to go")
    with pytest.raises(urllib.error.HTTPError) as gone:
        urllib.request.urlopen(f"{server}/v1/videos/{job_id}", timeout=10)
    assert gone.value.code == 404


def test_an_image_to_video_page_uploads_the_first_frame(browser, demo_env, tmp_path):
    """With an image-to-video model the page shows a file field for the first frame (not the last:
    demo-i2v is not first-last-frame), leaves the size to the image's aspect, and its job runs."""
    from PIL import Image
    from selenium.webdriver.common.by import By

    Image.new("RGB", (260, 150), (200, 40, 40)).save(tmp_path / "first.png")
    server = Server(tmp_path / "serve", model="demo-i2v", env={"WANJAX_CACHE": str(demo_env)}).start()
    driver = browser
    try:
        driver.get(server.url + "/")
        field = lambda name: driver.find_element(By.ID, name)  # noqa: E731
        _wait(lambda: field("image_label").is_displayed(), 30, "the first frame's field")
        assert not field("last_image_label").is_displayed() and field("size").get_attribute("value") == ""
        field("prompt").send_keys("the red card turns")
        field("num_inference_steps").clear()
        field("num_inference_steps").send_keys("2")
        field("image").send_keys(str(tmp_path / "first.png"))
        field("submit").click()
        card = _wait(
            lambda: driver.find_elements(By.CSS_SELECTOR, ".job.completed"), 90, "the job to complete"
        )[0]
        _keep_screenshot(driver, tmp_path, "serve_page_i2v.png")
        job = server.request("GET", f"/v1/videos/{card.get_attribute('data-id')}")[1]
        assert job["image"] is True and job["size"] != "192x128" and field("error").text == ""
    finally:
        server.stop()


def test_a_page_uploads_a_video_to_re_make(server, browser, tmp_path):
    """A text-to-video server: the page's video field and strength make a video to video job."""
    import numpy as np
    from selenium.webdriver.common.by import By

    from wanjax.io.video import write_mp4

    rng = np.random.default_rng(3)
    write_mp4(rng.integers(0, 255, (17, 64, 96, 3), dtype=np.uint8), tmp_path / "clip.mp4", fps=16)
    driver = browser
    driver.get(server + "/")
    field = lambda name: driver.find_element(By.ID, name)  # noqa: E731
    _wait(lambda: field("num_inference_steps").get_attribute("value"), 30, "the defaults in the form")
    assert field("video_label").is_displayed() and field("strength_label").is_displayed()
    assert not field("mask_label").is_displayed()  # not a VACE model
    field("prompt").send_keys("the same clip at dusk")
    field("video").send_keys(str(tmp_path / "clip.mp4"))
    field("strength").send_keys("0.5")
    field("num_inference_steps").clear()
    field("num_inference_steps").send_keys("4")
    field("submit").click()

    def listed():
        return json.load(urllib.request.urlopen(server + "/v1/videos", timeout=10))["data"]

    job = _wait(listed, 20, "the job")[0]
    assert job["video"] is True and job["strength"] == 0.5 and job["steps"] == 2, job


def test_an_animate_page_uploads_the_character_and_its_videos(browser, demo_env, videos, tmp_path):  # noqa: F811
    """With an Animate model the page offers the character, the pose and face videos (the background
    and mask videos in replace mode), the mode and the segment values ``/v1/server`` lists, sends them
    as one multipart body, and its job (frames left to the pose video) makes the video the same values
    sent as JSON make."""
    import numpy as np
    from PIL import Image
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select

    server = Server(tmp_path / "serve", model="demo-animate", env={"WANJAX_CACHE": str(demo_env)}).start()
    driver = browser
    try:
        info = server.request("GET", "/v1/server")[1]
        assert info["choices"] == {"mode": ["animate", "replace"], "prev_segment_conditioning_frames": [1, 5]}
        assert info["defaults"]["frames"] is None  # the pose video's
        driver.get(server.url + "/")
        field = lambda name: driver.find_element(By.ID, name)  # noqa: E731
        _wait(lambda: field("pose_video_label").is_displayed(), 30, "the pose video's field")
        assert field("image_title").text == "Character" and field("face_video_label").is_displayed()
        hidden = (
            "background_video_label",
            "mask_video_label",
            "video_label",
            "last_image_label",
            "mask_label",
        )
        assert not any(field(name).is_displayed() for name in hidden)
        mode = Select(field("mode"))
        assert [option.text for option in mode.options] == ["animate", "replace"]
        segments = (
            info["defaults"]["segment_frame_length"],
            info["defaults"]["prev_segment_conditioning_frames"],
        )
        assert (
            field("segment_frame_length").get_attribute("value"),
            field("frames").get_attribute("value"),
        ) == (
            str(segments[0]),
            "",
        )
        assert Select(field("prev_segment_conditioning_frames")).first_selected_option.text == str(
            segments[1]
        )
        assert field("size").get_attribute("value") == info["defaults"]["size"]  # not the character's aspect
        mode.select_by_value("replace")
        assert field("background_video_label").is_displayed() and field("mask_video_label").is_displayed()
        assert field("hint_mask_video").text == "required in replace mode"  # not the API's "optional"
        mode.select_by_value("animate")
        assert not field("background_video_label").is_displayed()

        driver.execute_script(  # what the form posts
            "window.posted = []; const send = window.fetch; window.fetch = (path, options) => {"
            " if (options && options.method === 'POST') posted.push(options.body instanceof FormData);"
            " return send(path, options); };"
        )
        field("prompt").send_keys("a dancer")
        for name, value in (
            ("size", "48x32"),
            ("num_inference_steps", "2"),
            ("seed", "3"),
            ("segment_frame_length", "5"),
        ):
            field(name).clear()
            field(name).send_keys(value)
        for name in ("image", "pose_video", "face_video"):
            field(name).send_keys(str(videos[name]))
        field("submit").click()
        card = _wait(
            lambda: driver.find_elements(By.CSS_SELECTOR, ".job.completed"), 300, "the job to complete"
        )[0]
        _keep_screenshot(driver, tmp_path, "serve_page_animate.png")
        assert driver.execute_script("return window.posted") == [True] and field("error").text == ""
        job = server.request("GET", f"/v1/videos/{card.get_attribute('data-id')}")[1]
        assert (job["image"], job["pose_video"], job["face_video"], job["background_video"]) == (
            True,
            True,
            True,
            False,
        )
        assert (job["mode"], job["segment_frame_length"], job["frames"], job["size"]) == (
            "animate",
            5,
            FRAMES,
            "48x32",
        )
        uploads = {name: b64(videos[name]) for name in ("image", "pose_video", "face_video")}
        values = {"size": "48x32", "num_inference_steps": 2, "seed": 3, "segment_frame_length": 5}
        sent = server.submit(prompt="a dancer", **values, **uploads)
        as_json = server.wait(sent["id"], timeout=300)
        sheets = [
            np.asarray(
                Image.open(
                    io.BytesIO(server.request("GET", f"/v1/videos/{j['id']}/content?variant=spritesheet")[1])
                )
            )
            for j in (job, as_json)
        ]
    finally:
        server.stop()
    np.testing.assert_array_equal(sheets[0], sheets[1])
