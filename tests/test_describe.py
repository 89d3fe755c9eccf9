"""``wanjax info``, ``wanjax plan`` and the flags' help: what a newcomer reads first."""

from __future__ import annotations

import argparse
import json
import re
import shutil

import pytest

from wanjax.cli.main import build_parser, main, subcommands
from wanjax.planning.plan import HEADROOM

COMPONENTS = ("scheduler", "text_encoder", "tokenizer", "transformer", "vae")
INFO_LINE = re.compile(r"(class|[\w.]*config\.json|weights|files): \S")


def info(capsys, path) -> dict[str, list[str]]:
    """``wanjax info path``'s lines (each indented under its heading) per ``[component]``."""
    assert main(["info", str(path)]) == 0
    sections = {}
    for section in capsys.readouterr().out.split("\n[")[1:]:
        name, body = section.split("]\n")
        lines = body.strip("\n").splitlines()
        assert all(line.startswith("  ") for line in lines), section
        sections[name] = [line.strip() for line in lines]
    return sections


def test_info_prints_every_component_alike(demo_env, capsys):
    """Each component: its class, each config file as ``key=value`` (no raw JSON), its weights or files."""
    sections = info(capsys, "demo")
    assert sorted(sections) == list(COMPONENTS)
    for name, lines in sections.items():
        assert lines[0].startswith("class: ") and lines[-1].startswith(("weights: ", "files: ")), name
        for line in lines:
            assert INFO_LINE.match(line) and "{" not in line and '"' not in line, (name, line)
    assert "class: UniPCMultistepScheduler" in sections["scheduler"]
    assert "flow_shift=3.0" in sections["scheduler"][1]
    assert (
        "class: T5Tokenizer" in sections["tokenizer"] and "model_max_length=512" in sections["tokenizer"][1]
    )
    assert "tokenizer.json (" in sections["tokenizer"][-1]
    assert sections["text_encoder"][0] == "class: UMT5EncoderModel"  # transformers' architectures list
    assert (
        sections["transformer"][1].startswith("config.json: ")
        and "num_layers=4" in sections["transformer"][1]
    )


def test_info_summarises_long_values_and_reads_any_component_folder(demo_env, tmp_path, capsys):
    """A real tokenizer_config.json lists hundreds of special tokens: counted, not printed; a component
    folder given alone is recognised by its own marker file (scheduler_config.json, tokenizer.json)."""
    from wanjax.pipeline.hub import resolve_model

    root = tmp_path / "model"
    shutil.copytree(resolve_model("demo").path, root)
    config = root / "tokenizer" / "tokenizer_config.json"
    tokens = [f"<extra_id_{i}>" for i in range(300)]
    config.write_text(json.dumps({**json.loads(config.read_text()), "additional_special_tokens": tokens}))
    tokenizer = info(capsys, root / "tokenizer")["tokenizer"]
    assert "additional_special_tokens=<300 items>" in tokenizer[1] and "extra_id_1" not in tokenizer[1]
    assert "flow_shift=3.0" in info(capsys, root / "scheduler")["scheduler"][1]


def test_every_flag_of_every_subcommand_has_help():
    parser = build_parser(subcommands())
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(commands.choices) == set(subcommands())
    for name, command in commands.choices.items():
        for action in command._actions:
            if not isinstance(action, argparse._HelpAction):
                assert action.help, f"wanjax {name} {'/'.join(action.option_strings) or action.dest}"


def plan_output(capsys, *args: str) -> tuple[dict[str, float], list[str], str, str]:
    """``wanjax plan``: each mesh's printed peak, the fitting meshes, the suggested mesh and the why line."""
    assert main(["plan", *args]) == 0
    out = capsys.readouterr().out
    tables = re.findall(r"mesh (\S+):\n(?:.*\n)*?  peak +([\d.]+) GiB .*: (fits|does NOT fit)", out)
    peaks = {mesh: float(peak) for mesh, peak, _ in tables}
    fitting = [mesh for mesh, _, verdict in tables if verdict == "fits"]
    suggested = re.search(r"suggested: --mesh (\S+) .*\n  why: (.*)\n", out)
    assert suggested, out
    return peaks, fitting, suggested.group(1), suggested.group(2)


def test_plan_says_why_it_prefers_auto_to_a_mesh_with_a_lower_peak(capsys):
    """14B at 720p on 8 devices: ``--mesh auto`` fits; tp=8 peaks lower but splits both CFG halves'
    blocks over all 8 devices, where dp=2 leaves 4 per block."""
    peaks, fitting, suggested, why = plan_output(capsys, "--model", "14B", "--num_devices", "8")
    leanest = min(fitting, key=peaks.get)
    assert suggested == "dp=2,sp=1,tp=4" and leanest == "dp=1,sp=1,tp=8"
    assert why.startswith("--mesh auto (generate's default) fits")
    assert "4 devices that exchange activations (dp=2: batch, tp=4: heads)" in why
    lower = re.search(rf"; {leanest} peaks ([\d.]+) GiB lower, but on 8 devices \(tp=8: heads\)$", why)
    assert lower, why
    assert float(lower.group(1)) == pytest.approx(peaks[suggested] - peaks[leanest], abs=0.011)


def test_plan_falls_back_to_the_lowest_fitting_peak_and_says_so(capsys):
    """14B on 6 devices: auto (dp=2, sp=3: 40 heads do not split 3 ways) replicates the weights and
    does not fit; the suggestion is the fitting mesh with the lowest peak, and the line says why."""
    peaks, fitting, suggested, why = plan_output(capsys, "--model", "14B", "--num_devices", "6")
    assert "dp=2,sp=3,tp=1" not in fitting and suggested == min(fitting, key=peaks.get)
    usable = HEADROOM * 32  # GiB, the default --device_memory
    assert why == (
        f"--mesh auto (dp=2,sp=3,tp=1) would peak at {peaks['dp=2,sp=3,tp=1']:.2f} GiB, over the "
        f"{usable:.1f} GiB usable; this is the fitting mesh with the lowest peak"
    )


def test_plan_on_one_device_names_no_alternative(capsys):
    _, fitting, suggested, why = plan_output(
        capsys, "--model", "1.3B", "--num_devices", "1", "--height", "480"
    )
    assert fitting == [suggested] == ["dp=1,sp=1,tp=1"]
    assert why == "--mesh auto (generate's default) fits; each DiT block runs on one device"


@pytest.mark.parametrize(
    ("model", "extra", "options"),
    [
        ("demo-i2v", ("image_encoder", "image_processor"), None),
        ("demo-a14b", ("transformer_2",), "boundary_ratio=0.875"),
        ("demo-ti2v", (), "expand_timesteps=true"),
    ],
)
def test_info_describes_the_wan_family(demo_env, capsys, model, extra, options):
    """The image-to-video and Wan 2.2 demo models: their extra components, and the pipeline options
    ``model_index.json`` carries."""
    assert main(["info", model]) == 0
    out = capsys.readouterr().out
    sections = {part.split("]\n")[0] for part in out.split("\n[")[1:]}
    assert sections == {*COMPONENTS, *extra}
    header = out.split("\n[")[0]
    assert (options in header) if options else ("=" not in header.splitlines()[-1])


def test_info_of_a_vace_variant_names_its_control_blocks(capsys):
    assert main(["info", "VACE-1.3B"]) == 0
    out = capsys.readouterr().out
    assert "Wan-AI/Wan2.1-VACE-1.3B-diffusers" in out
    assert (
        "VACE: 15 control blocks, after layers 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28; 96"
        in out
    )
