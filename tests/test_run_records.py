"""What a run leaves behind and says: the files it names exist, a record of every run beside its video,
prompt and seed in the mp4, names never reused, modes as the umask says; and the command line's
small promises (prompts required, prompt files, no abbreviations, --version, a closed pipe)."""

from __future__ import annotations

import datetime
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import av
import pytest

from wanjax.cli.main import main
from wanjax.jobs import outputs
from wanjax.pipeline import stages
from wanjax.pipeline.prompts import OFFICIAL_NEGATIVE_PROMPT, negative_prompt, read_prompt_file
from wanjax.version import __version__

SMALL = ("--height", "32", "--width", "32", "--frames", "5", "--num_inference_steps", "2")
NOW = datetime.datetime(2026, 11, 24, 12, 0, 0)


def run(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line_error(capsys, args, needle: str) -> str:
    code, _, err = run(capsys, *args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert needle in lines[0], lines[0]
    return lines[0]


class FrozenClock:
    """Stands for the ``datetime`` module in :mod:`wanjax.jobs.outputs`: every run starts in the same second."""

    class datetime(datetime.datetime):  # named as the class it stands for
        @classmethod
        def now(cls, tz=None):
            return NOW


def mp4_tags(path: Path) -> dict[str, str]:
    with av.open(str(path)) as container:
        return dict(container.metadata)


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.mark.slow
def test_runs_in_the_same_second_keep_every_file_and_record_it(
    demo_env, tmp_path, capsys, monkeypatch, umask_022
):
    """Two default-named runs in one second: a batch with previews, then one video. Every file the
    report names exists, nothing is overwritten, each run leaves NAME.json beside its videos, and
    each mp4 carries its prompt and seed."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(outputs, "datetime", FrozenClock)
    cache = ("--jax_cache_dir", tmp_path / "jax")
    code, out, err = run(capsys, "generate", "--model", "demo", "--prompt", "A", "--prompt", "B", *SMALL, *cache,
                         "--preview", "sheet.png", "--negative_prompt", "official")  # fmt: skip
    assert code == 0, err
    stem = "20261124_120000"
    first = json.loads(Path(f"{stem}.json").read_text())
    assert first["outputs"] == {
        "video": [f"{stem}_0.mp4", f"{stem}_1.mp4"],
        "preview": ["sheet_0.png", "sheet_1.png"],
        "record": f"{stem}.json",
    }
    for kind in ("video", "preview"):
        for name in first["outputs"][kind]:
            assert Path(name).is_file() and name in out, name
    assert not Path("sheet.png").exists()
    assert first["arguments"]["prompt"] == ["A", "B"] and first["prompts"] == ["A", "B"]
    assert first["negative_prompt"] == OFFICIAL_NEGATIVE_PROMPT
    assert first["sampling"]["seed"] == 42 and first["wanjax_version"] == __version__
    assert first["environment"]["jax"] and first["stages"]["denoise"]["run_s"] > 0
    for i, prompt in enumerate("AB"):
        tags = mp4_tags(Path(f"{stem}_{i}.mp4"))
        described = json.loads(tags["comment"])
        assert tags["title"] == prompt and described["prompt"] == prompt
        assert described["seed"] == 42 + i and described["negative_prompt"] == OFFICIAL_NEGATIVE_PROMPT
        assert described["num_inference_steps"] == 2 and described["wanjax_version"] == __version__
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}

    code, _, err = run(capsys, "generate", "--model", "demo", "--prompt", "C", "--seed", "5", *SMALL, *cache)
    assert code == 0, err
    second = json.loads(Path(f"{stem}-2.json").read_text())
    assert second["outputs"]["video"] == [f"{stem}-2.mp4"] and Path(f"{stem}-2.mp4").is_file()
    assert json.loads(mp4_tags(Path(f"{stem}-2.mp4"))["comment"])["seed"] == 5
    assert {name: (tmp_path / name).read_bytes() for name in before} == before  # the first run's files
    for path in tmp_path.iterdir():
        if path.is_file():
            assert stat.S_IMODE(path.stat().st_mode) == 0o644, path


def test_stage_files_follow_the_umask(demo_env, tmp_path, capsys, umask_022):
    d = tmp_path / "s"
    code, _, err = run(capsys, "encode", "--model", "demo", "--prompt", "a cat", "--output_dir", d)
    assert code == 0, err
    for name in (stages.EMBEDDINGS_FILE, stages.CONFIG_FILE):
        assert stat.S_IMODE((d / name).stat().st_mode) == 0o644, name


def test_fresh_video_name_skips_every_name_a_run_left(tmp_path):
    stem = "20261124_120000"
    assert outputs.fresh_video_name(tmp_path, NOW) == f"{stem}.mp4"
    for taken, expected in ((f"{stem}_0.mp4", f"{stem}-2.mp4"), (f"{stem}-2.json", f"{stem}-3.mp4")):
        (tmp_path / taken).touch()
        assert outputs.fresh_video_name(tmp_path, NOW) == expected


def test_a_prompt_is_required_once(demo_env, tmp_path, capsys):
    out = ("--output_video", tmp_path / "v.mp4")
    one_line_error(capsys, ("generate", "--model", "demo", *out), "no prompt: give --prompt")
    one_line_error(capsys, ("encode", "--model", "demo", "--output_dir", tmp_path), "no prompt")
    (tmp_path / "p.txt").write_text("a cat\n")
    both = ("generate", "--prompt", "a", "--prompt_file", tmp_path / "p.txt", *out)
    one_line_error(capsys, both, "--prompt and --prompt_file both given")
    assert not list(tmp_path.glob("*.mp4")) and not list(tmp_path.glob("*.json"))


def test_prompt_files_skip_blank_and_comment_lines(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("# prompts for the demo\n  a cat  \n\n   \n  # later\ntwo dogs # not a comment\n")
    assert read_prompt_file(path) == ["a cat", "two dogs # not a comment"]
    path.write_text("# only comments\n\n")
    with pytest.raises(Exception, match="holds no prompt"):
        read_prompt_file(path)


def test_the_official_negative_prompt_is_the_one_diffusers_examples_use():
    import diffusers.pipelines.wan.pipeline_wan as reference

    example = re.search(r'negative_prompt = "([^"]+)"', Path(reference.__file__).read_text())
    assert example and negative_prompt("official") == example[1]
    assert negative_prompt(None) == "" and negative_prompt("blurry") == "blurry"


def test_abbreviated_flags_are_refused(capsys):
    for args in (("generate", "--num_inference_step", "3"), ("plan", "--num_dev", "8")):
        one_line_error(capsys, args, "unrecognized arguments")


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"wanjax {__version__}"


@pytest.mark.slow
def test_a_closed_pipe_is_not_an_error(demo_env):
    """``wanjax info demo | head -0``: the reader is gone before anything is printed."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    read, write = os.pipe()
    os.close(read)
    result = subprocess.run(
        [sys.executable, "-m", "wanjax.cli", "info", "demo"], stdout=write, stderr=subprocess.PIPE, env=env
    )
    os.close(write)
    assert result.returncode == 0 and not result.stderr, result.stderr
