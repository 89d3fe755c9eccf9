"""The README's facts and commands, as written there: the demo's size, which names ``bench --arch``
takes, the step-cache table's flags on the demo, and the serving example against a demo server."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from helpers.serve_process import TERMINATED, Server

from wanjax.cli.main import main
from wanjax.models import registry

README = (Path(__file__).parents[1] / "README.md").read_text()


def table_rows(heading: str) -> list[list[str]]:
    """The cells of each body row of the first table after ``heading``."""
    section = README.split(f"\n{heading}\n", 1)[1]
    rows = [line for line in section.split("\n\n## ", 1)[0].splitlines() if line.startswith("|")]
    return [[c.strip() for c in row.strip().strip("|").split(" | ")] for row in rows[2:]]


def code_spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def test_the_demo_row_is_the_demo_models_video():
    (demo,) = [row for row in table_rows("## Models") if row[0].startswith("`demo`")]
    names = code_spans(demo[0])
    assert sorted(names) == sorted(n for n, v in registry.registry().items() if v.demo)
    for name in names:
        d = registry.variant(name).defaults
        assert demo[3] == f"{d.width}x{d.height}, {d.frames}, {d.fps:g}", name


def test_bench_takes_the_variant_names_and_not_the_demos(capsys):
    from wanjax.tools import bench

    assert "`bench --arch` take the variant names" in README and "`bench` not" in README
    for name in registry.released():
        assert bench.BenchConfig(arch=name).variant.name == name
    assert main(["bench", "--arch", "demo"]) == 2
    assert "invalid choice 'demo'" in capsys.readouterr().err


def _cache_rows() -> dict[str, tuple[list[str], str]]:
    """Each step cache row: its flags as the table writes them, and what it needs."""
    rows = {}
    for method, flag, needs, _ in table_rows("## Step caches"):
        (flags,) = code_spans(flag)
        rows[method] = (shlex.split(flags), needs)
    return rows


DEMO_RUN = ("generate", "--model", "demo", "--prompt", "a cat", "--num_inference_steps", "6")
DEMO_RUN += ("--height", "32", "--width", "48", "--frames", "5")


@pytest.mark.slow
def test_the_cache_tables_flags_run_on_the_demo_or_name_what_it_needs(demo_env, tmp_path, capsys):
    """A row that needs nothing runs as written; one that says the demos need a curve or coefficients
    is refused naming that flag; plain ``--cache taylorseer`` is refused, as the table says."""
    rows = _cache_rows()
    assert set(rows) == {"MagCache", "First-Block Cache", "TeaCache", "TaylorSeer", "SeaCache"}
    for method, (flags, needs) in rows.items():
        out = tmp_path / f"{method}.mp4"
        code = main([*DEMO_RUN, *flags, "--output_video", str(out), "--quiet"])
        err = capsys.readouterr().err
        named = re.search(r"the demos included, need `(--\w+)", needs)
        if named:  # refused before any step, naming the flag the row names
            assert code == 2 and named.group(1) in err and not out.exists(), (method, err)
        else:
            assert code == 0 and out.is_file(), (method, err)
    assert "plain `--cache taylorseer` is refused" in rows["TaylorSeer"][1]
    assert main([*DEMO_RUN, "--cache", "taylorseer", "--output_video", str(tmp_path / "t.mp4")]) == 2
    assert "use_lite_mode" in capsys.readouterr().err


def _serving_example() -> tuple[list[str], dict]:
    """The serving section's ``wanjax serve`` command and the body its first ``curl`` posts."""
    block = README.split("\n## Serving\n", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    lines = block.replace("\\\n", " ").splitlines()
    serve = shlex.split(lines[0].split("#")[0])
    curl = shlex.split(lines[1].split("  #")[0])
    return serve, json.loads(curl[curl.index("-d") + 1])


@pytest.mark.slow
def test_the_serving_example_makes_a_video_on_the_demo_server(demo_env, tmp_path):
    serve, body = _serving_example()
    assert serve == ["wanjax", "serve", "--model", "demo"]
    server = Server(tmp_path, model="demo", env={"WANJAX_CACHE": str(demo_env)}).start()
    try:
        status, job, _ = server.request("POST", "/v1/videos", {**body, "num_inference_steps": 2})
        assert status == 202, job
        done = server.wait(job["id"])
        assert done["size"] == body["size"] and done["seed"] == body["seed"]
        status, video, headers = server.request("GET", f"/v1/videos/{job['id']}/content")
        assert status == 200 and headers["content-type"] == "video/mp4" and len(video) > 1000
    finally:
        assert server.stop() == TERMINATED, server.stderr
