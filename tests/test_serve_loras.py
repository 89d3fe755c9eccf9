"""Per-request LoRAs: jobs name adapters among the files of the server's ``--lora_dir``; each job's
video is the one ``wanjax generate --lora`` makes, the base weights come back exactly for a job
without one, and jobs of one LoRA set run back to back."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers.lora import diffusers_lora_for
from helpers.serve_process import TERMINATED, Server
from helpers.small_video import SMALL_GENERATE, SMALL_JOB
from PIL import Image

from wanjax import WanPipeline

PROMPT = "A lighthouse in a storm"


def _sheet(server: Server, job_id: str, path) -> np.ndarray:
    """The job's contact sheet (every raw frame)."""
    status, sheet, _ = server.request("GET", f"/v1/videos/{job_id}/content?variant=spritesheet")
    assert status == 200
    path.write_bytes(sheet)
    return np.asarray(Image.open(path))


def _generate_sheet(tmp_path, name: str, prompt: str, *loras: str, flags: tuple[str, ...] = ()) -> np.ndarray:
    """``wanjax generate`` of the job's values (and the server's start ``flags``) in a new process; its
    contact sheet."""
    sheet = tmp_path / f"cli_{name}.png"
    command = [sys.executable, "-m", "wanjax.cli", "generate", "--model", "demo", "--prompt", prompt]
    command += ["--num_inference_steps", "3", "--seed", "5", "--preview", str(sheet)]
    command += SMALL_GENERATE  # the jobs' small videos: what the test compares is their weights
    command += ["--output_video", str(tmp_path / f"cli_{name}.mp4"), *flags]
    for value in loras:
        command += ["--lora", value]
    assert subprocess.run(command, stdin=subprocess.DEVNULL, check=False).returncode == 0
    return np.asarray(Image.open(sheet))


@pytest.mark.slow
def test_jobs_with_their_own_loras_equal_generate_and_run_grouped(demo_env, tmp_path):
    cfg = WanPipeline.from_pretrained("demo").components.transformer_config
    folder = tmp_path / "loras"
    folder.mkdir()
    for seed, name in enumerate(("style_a", "style_b")):
        diffusers_lora_for(cfg, folder / f"{name}.safetensors", seed=seed)
    wrong = dataclasses.replace(cfg, ffn_dim=cfg.ffn_dim * 2)
    diffusers_lora_for(wrong, folder / "other_model.safetensors", seed=9)  # another model's LoRA

    flags = ("--lora_dir", str(folder), "--lora_cache", "1GiB", "--max_steps", "60")
    server = Server(tmp_path / "out", *flags, env={"WANJAX_CACHE": str(demo_env)}).start()
    try:
        status, error, _ = server.request("POST", "/v1/videos", {"prompt": "a", "lora": [{"name": "nope"}]})
        assert status == 400 and error["error"]["param"] == "lora"
        assert (
            "no LoRA 'nope' on this server; it has: other_model, style_a, style_b"
            in error["error"]["message"]
        )
        status, error, _ = server.request(
            "POST", "/v1/videos", {"prompt": "a", "lora": [{"name": "other_model"}]}
        )
        assert status == 400 and "LoRA other_model" in error["error"]["message"], error
        assert str(folder) not in error["error"]["message"]  # no path on the server
        status, error, _ = server.request(
            "POST", "/v1/videos", {"prompt": "a", "lora_2": [{"name": "style_a"}]}
        )
        assert status == 400 and "two-expert" in error["error"]["message"], error

        # While a job without LoRAs runs, four wait: the same prompt and seed with style_a, none and
        # style_b, and another prompt with style_a again.
        common = {"num_inference_steps": 3, "seed": 5, **SMALL_JOB}
        blocker = server.submit(prompt="a long one", num_inference_steps=20)
        while server.request("GET", f"/v1/videos/{blocker['id']}")[1]["status"] != "in_progress":
            time.sleep(0.02)
        a = server.submit(prompt=PROMPT, lora=[{"name": "style_a", "scale": 0.8}], **common)
        plain = server.submit(prompt=PROMPT, **common)
        b = server.submit(prompt=PROMPT, lora=[{"name": "style_b"}], **common)
        a_again = server.submit(prompt="A quiet harbour", lora=[{"name": "style_a", "scale": 0.8}], **common)
        jobs = {"a": a, "plain": plain, "b": b, "a_again": a_again}
        done = {name: server.wait(job["id"]) for name, job in jobs.items()}
        sheets = {name: _sheet(server, job["id"], tmp_path / f"{name}.png") for name, job in jobs.items()}
    finally:
        assert server.stop() == TERMINATED, server.stderr
    assert done["a"]["lora"] == [{"name": "style_a", "scale": 0.8}] and done["plain"]["lora"] == []
    order = re.findall(r"job (\S+) completed in", server.stderr)
    ran = {job["id"]: name for name, job in jobs.items()}
    # After the job without LoRAs, the one waiting with the same weights; then the oldest, style_a,
    # and the other style_a job at once; then style_b.
    assert [ran.get(i, "blocker") for i in order] == ["blocker", "plain", "a", "a_again", "b"]

    path = {name: f"{folder / name}.safetensors" for name in ("style_a", "style_b")}
    expected = {
        "a": _generate_sheet(tmp_path, "a", PROMPT, f"{path['style_a']}:0.8"),
        "plain": _generate_sheet(tmp_path, "plain", PROMPT),
        "b": _generate_sheet(tmp_path, "b", PROMPT, path["style_b"]),
        "a_again": _generate_sheet(tmp_path, "a_again", "A quiet harbour", f"{path['style_a']}:0.8"),
    }
    for name, sheet in sheets.items():
        np.testing.assert_array_equal(sheet, expected[name], err_msg=name)  # the very frames
    assert not np.array_equal(sheets["a"], sheets["plain"]) and not np.array_equal(sheets["a"], sheets["b"])


@pytest.mark.slow
def test_a_w8a8_server_merges_a_jobs_lora_into_its_int8_weights_as_generate_does(demo_env, tmp_path):
    """``--weights_dtype int8 --activations_dtype int8``: a job's LoRA merged into the int8 kernels
    the blocks multiply as W8A8, the video ``wanjax generate`` makes with the same flags and LoRA; the
    next job without one runs on the base weights again."""
    cfg = WanPipeline.from_pretrained("demo").components.transformer_config
    folder = tmp_path / "loras"
    folder.mkdir()
    diffusers_lora_for(cfg, folder / "style_a.safetensors", seed=0)
    w8a8 = ("--weights_dtype", "int8", "--activations_dtype", "int8")
    server = Server(tmp_path / "out", *w8a8, "--lora_dir", str(folder), env={"WANJAX_CACHE": str(demo_env)})
    server.start()
    try:
        common = {"num_inference_steps": 3, "seed": 5, **SMALL_JOB}
        a = server.wait(
            server.submit(prompt=PROMPT, lora=[{"name": "style_a", "scale": 0.8}], **common)["id"]
        )
        plain = server.wait(server.submit(prompt=PROMPT, **common)["id"])
        sheets = {
            name: _sheet(server, job["id"], tmp_path / f"{name}.png")
            for name, job in (("a", a), ("plain", plain))
        }
    finally:
        assert server.stop() == TERMINATED, server.stderr
    record = json.loads((tmp_path / "out" / "videos" / f"{a['id']}.json").read_text())
    assert record["activations_dtype"] == "int8"  # the blocks multiplied int8 x int8
    lora = f"{folder / 'style_a'}.safetensors:0.8"
    np.testing.assert_array_equal(sheets["a"], _generate_sheet(tmp_path, "a", PROMPT, lora, flags=w8a8))
    np.testing.assert_array_equal(sheets["plain"], _generate_sheet(tmp_path, "plain", PROMPT, flags=w8a8))
    assert not np.array_equal(sheets["a"], sheets["plain"])
