"""Model names: hub ids resolved with ``huggingface_hub`` in a real cache layout (refs, snapshots,
blobs), revisions, the opt-in download and its one-line errors, and the public loaders taking every
name ``--model`` takes. Nothing here reaches the network: the hub endpoint is a closed local port."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import huggingface_hub
import jax
import numpy as np
import pytest
from huggingface_hub import constants
from huggingface_hub.utils import filter_repo_objects

import wanjax
from wanjax import WanPipeline
from wanjax.errors import CheckpointError, WanjaxError
from wanjax.models import dit, tokenizer, umt5, vae
from wanjax.pipeline.hub import resolve_model
from wanjax.sampling import scheduler

REPO = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
MAIN = hashlib.sha1(b"main").hexdigest()
V2 = hashlib.sha1(b"v2").hexdigest()
CLOSED_PORT = "http://127.0.0.1:9"


def add_snapshot(cache: Path, repo_id: str, source: Path, commit: str, ref: str | None = None) -> Path:
    """Put ``source``'s files in ``cache`` as huggingface_hub does: content-addressed blobs, a snapshot
    of relative symlinks to them, and ``refs/<ref>`` holding the commit."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    for file in sorted(p for p in source.rglob("*") if p.is_file()):
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / file.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    if ref is not None:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """An empty HF cache, offline off, the hub a closed port. huggingface_hub reads HF_HUB_CACHE and
    HF_HUB_OFFLINE when it is imported, so its constants are set (a fresh process sees the variables)."""
    cache = tmp_path / "hf"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", CLOSED_PORT)
    return cache


@pytest.fixture
def demo_dir(demo_env):
    return resolve_model("demo").path


@pytest.fixture
def cached_repo(hf_cache, demo_dir):
    """The demo model cached as REPO at refs/main."""
    return add_snapshot(hf_cache, REPO, demo_dir, MAIN, "main")


def one_line(error: pytest.ExceptionInfo, *needles: str) -> str:
    message = str(error.value)
    assert "\n" not in message, message
    for needle in needles:
        assert needle in message, message
    return message


def test_repo_id_resolves_to_the_snapshot_refs_main_names(cached_repo):
    source = resolve_model(REPO)
    assert source.path == cached_repo and source.name == REPO and not source.is_demo
    assert (source.path / "transformer" / "config.json").is_file()


def test_revisions_branch_or_commit(hf_cache, demo_dir, cached_repo):
    v2 = add_snapshot(hf_cache, REPO, demo_dir / "scheduler", V2, "v2")
    assert resolve_model(REPO, revision="v2").path == v2
    assert resolve_model(REPO, revision=V2).path == v2
    assert resolve_model(REPO, revision=MAIN).path == cached_repo
    with pytest.raises(WanjaxError) as e:
        resolve_model(REPO, revision="v3")
    one_line(e, f"{REPO} (revision v3)", "not in the Hugging Face cache", f"hf download {REPO} --revision v3")


def test_missing_repo_says_how_to_get_it(hf_cache):
    with pytest.raises(WanjaxError) as e:
        resolve_model(REPO)
    one_line(e, "not in the Hugging Face cache", str(hf_cache), f"`hf download {REPO}`", "--download")


def test_bad_names(hf_cache, tmp_path, demo_env):
    with pytest.raises(CheckpointError) as e:
        resolve_model(tmp_path / "missing")
    one_line(e, "model path does not exist")
    with pytest.raises(CheckpointError):
        resolve_model("a/b--c")  # not a valid repo id: a missing path
    for local in ("demo", tmp_path):
        with pytest.raises(WanjaxError) as e:
            resolve_model(local, revision="main")
        one_line(e, "a revision applies only to hub repo ids")


def test_offline_download_is_refused_at_once(hf_cache, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(WanjaxError) as e:
        resolve_model(REPO, download=True)
    one_line(e, "HF_HUB_OFFLINE is set", f"hf download {REPO}")


def test_network_failure_during_download(hf_cache):
    with pytest.raises(WanjaxError) as e:
        resolve_model(REPO, revision="v2", download=True)
    one_line(e, f"{REPO} (revision v2): download failed", "ConnectError", "check the network")


# Files as a diffusers Wan repo lists them, with the kinds a download must skip.
REPO_FILES = [
    ".gitattributes",
    "README.md",
    "model_index.json",
    "scheduler/scheduler_config.json",
    "text_encoder/model-00001-of-00005.safetensors",
    "text_encoder/model.safetensors.index.json",
    "text_encoder/pytorch_model.bin",
    "tokenizer/spiece.model",
    "tokenizer/tokenizer.json",
    "transformer/diffusion_pytorch_model.safetensors",
    "vae/diffusion_pytorch_model.pth",
    "vae/extra.pt",
    "vae/state.pkl",
]
PIPELINE_FILES = [
    "model_index.json",
    "scheduler/scheduler_config.json",
    "text_encoder/model-00001-of-00005.safetensors",
    "text_encoder/model.safetensors.index.json",
    "tokenizer/spiece.model",
    "tokenizer/tokenizer.json",
    "transformer/diffusion_pytorch_model.safetensors",
]


def test_download_fetches_pipeline_files_only(hf_cache, demo_dir, monkeypatch):
    """A missing repo is looked up in the cache, then downloaded (configs, safetensors, tokenizer files
    only); once cached, download=True does not go to the hub again."""
    calls = []
    look_up = huggingface_hub.snapshot_download

    def snapshot_download(repo_id, **kwargs):
        calls.append(kwargs["local_files_only"])
        if kwargs["local_files_only"]:
            return look_up(repo_id, **kwargs)
        assert (
            list(filter_repo_objects(REPO_FILES, allow_patterns=kwargs["allow_patterns"])) == PIPELINE_FILES
        )
        return str(add_snapshot(hf_cache, repo_id, demo_dir, MAIN, "main"))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    snapshot = resolve_model(REPO, download=True).path
    assert calls == [True, False] and (snapshot / "model_index.json").is_file()
    assert resolve_model(REPO, download=True).path == snapshot and calls == [True, False, True]


@pytest.mark.slow
def test_environment_variables_reach_huggingface_hub(tmp_path, demo_dir):
    """HF_HUB_CACHE and HF_HUB_OFFLINE as a fresh process sees them: found, and refused without waiting."""
    cache = tmp_path / "hf"
    snapshot = add_snapshot(cache, REPO, demo_dir, MAIN, "main")
    script = (
        "import sys; from wanjax.errors import WanjaxError; from wanjax.pipeline.hub import resolve_model\n"
        "print(resolve_model(sys.argv[1]).path)\n"
        "try: resolve_model('Wan-AI/Missing', download=True)\n"
        "except WanjaxError as e: print(e)\n"
    )
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": CLOSED_PORT}
    out = subprocess.run(
        [sys.executable, "-c", script, REPO], env=env, capture_output=True, text=True, timeout=120, check=True
    ).stdout.splitlines()
    path, error = out  # the error is one line
    assert path == str(snapshot) and "HF_HUB_OFFLINE is set" in error


def names(demo_dir: Path, component: str) -> list[str | Path]:
    """Every way to name one model's component: the demo, the hub id, the root and the folder."""
    return ["demo", REPO, demo_dir, demo_dir / component]


def assert_same_tree(a, b) -> None:
    assert jax.tree.leaves(a) and jax.tree.structure(a) == jax.tree.structure(b)
    jax.tree.map(np.testing.assert_array_equal, a, b)


def test_load_transformer_takes_model_names(cached_repo, demo_dir):
    expected = dit.load_transformer(demo_dir, "float32").params
    for name in names(demo_dir, "transformer"):
        assert_same_tree(wanjax.load_transformer(name, "float32").params, expected)
    assert_same_tree(wanjax.load_transformer(REPO, "float32", revision=MAIN).params, expected)


def test_load_vae_takes_model_names(cached_repo, demo_dir):
    expected = vae.load_vae(demo_dir)
    for name in names(demo_dir, "vae"):
        got = wanjax.load_vae(name)
        assert_same_tree(got.params, expected.params)
        assert_same_tree(got.encoder_params, expected.encoder_params)


def test_load_text_encoder_and_tokenizer_take_model_names(cached_repo, demo_dir):
    expected = umt5.load_text_encoder(demo_dir, "float32")
    ids = tokenizer.load_tokenizer(demo_dir)("a red cat", 8).ids
    for name in names(demo_dir, "text_encoder"):
        got = wanjax.load_text_encoder(name, "float32")
        assert_same_tree(got.params, expected.params)
        np.testing.assert_array_equal(got.tokenizer("a red cat", 8).ids, ids)
    for name in [*names(demo_dir, "tokenizer"), demo_dir / "tokenizer" / "tokenizer.json"]:
        np.testing.assert_array_equal(wanjax.load_tokenizer(name)("a red cat", 8).ids, ids)


def test_make_scheduler_takes_model_names(cached_repo, demo_dir):
    expected = scheduler.make_scheduler(demo_dir, 4)
    config_file = demo_dir / "scheduler" / "scheduler_config.json"
    config = scheduler.load_scheduler_config(demo_dir)
    for source in [*names(demo_dir, "scheduler"), config_file, config]:
        got = wanjax.make_scheduler(source, 4)
        np.testing.assert_array_equal(got.timesteps, expected.timesteps)
        np.testing.assert_array_equal(got.sigmas, expected.sigmas)


def test_pipeline_from_pretrained_takes_revisions(hf_cache, demo_dir, cached_repo):
    v2 = add_snapshot(hf_cache, REPO, demo_dir, V2, "v2")
    assert wanjax.WanPipeline.from_pretrained(REPO, jax_cache_dir=False).components.path == cached_repo
    assert wanjax.WanPipeline.from_pretrained(REPO, revision="v2", jax_cache_dir=False).components.path == v2
    with pytest.raises(WanjaxError, match="HF_HUB_OFFLINE"), pytest.MonkeyPatch.context() as mp:
        mp.setattr(constants, "HF_HUB_OFFLINE", True)
        wanjax.WanPipeline.from_pretrained("Wan-AI/Missing", download=True, jax_cache_dir=False)


def test_cli_revision_and_download_flags(hf_cache, demo_dir, cached_repo, capsys):
    """``info --revision`` reads that snapshot; an uncached revision names the fix; ``--download``
    reaches the hub (a closed port here), and the error says so in one line."""
    from wanjax.cli.main import main

    add_snapshot(hf_cache, REPO, demo_dir, V2, "v2")
    assert main(["info", REPO, "--revision", "v2"]) == 0
    assert capsys.readouterr().out.startswith(
        str(hf_cache / f"models--{REPO.replace('/', '--')}/snapshots/{V2}")
    )
    for flags, needle in (
        (["--revision", "v3"], f"hf download {REPO} --revision v3"),
        (["--revision", "v3", "--download"], "download failed"),
    ):
        assert main(["info", REPO, *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and needle in err, err
    args = ["generate", "--model", REPO, "--revision", "v3", "--prompt", "a cat"]
    assert main(args) == 2
    assert "--revision v3" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (
            {"transformer_2": ["diffusers", "WanTransformer3DModel"]},
            "needs both transformer_2 and boundary_ratio",
        ),
        ({"boundary_ratio": 0.9}, "needs both transformer_2 and boundary_ratio"),
        (
            {
                "expand_timesteps": True,
                "transformer_2": ["diffusers", "WanTransformer3DModel"],
                "boundary_ratio": 0.9,
            },
            "expand_timesteps with two experts",
        ),
        ({"_class_name": "SkyReelsV2Pipeline"}, "a SkyReelsV2Pipeline; wanjax runs WanPipeline, "),
        ({"transformer_2": ["diffusers", "WanTransformer3DModel"], "boundary_ratio": 1.5}, "between 0 and 1"),
        ({"flow_guidance": 2.0}, "unknown field(s) flow_guidance"),
    ],
)
def test_a_model_index_entry_wanjax_does_not_act_on_is_an_error(
    tiny_pipeline_dir, tmp_path, entries, message, capsys
):
    """A Wan 2.2 directory (or any entry wanjax would ignore) is refused by name before any weight,
    never run with part of it; ``[null, null]`` entries (absent optional components) and Wan 2.2's
    defaults (``expand_timesteps: false``, ``boundary_ratio: null``) are accepted."""
    import json
    import shutil

    from wanjax.cli.main import main

    root = tmp_path / "model"
    shutil.copytree(tiny_pipeline_dir, root)
    index = json.loads((root / "model_index.json").read_text())
    accepted = {**index, "image_encoder": [None, None], "transformer_2": [None, None], "boundary_ratio": None}
    (root / "model_index.json").write_text(json.dumps({**accepted, "expand_timesteps": False}))
    WanPipeline.from_pretrained(root, jax_cache_dir=False)
    (root / "model_index.json").write_text(json.dumps({**index, **entries}))
    with pytest.raises(WanjaxError, match=re.escape(message)):
        WanPipeline.from_pretrained(root, jax_cache_dir=False)
    out = tmp_path / "never.mp4"
    assert main(["generate", "--model", str(root), "--prompt", "a cat", "--output_video", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and not out.exists()
