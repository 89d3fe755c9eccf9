"""Single transformer files: the original Wan layout (with and without ComfyUI's prefix) and
fp8-scaled weights, checked against diffusers' own conversion (``convert_wan_transformer_to_diffusers``,
``from_single_file``) and loaded bit-identically to the diffusers directory they were made from."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
from diffusers import WanTransformer3DModel
from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers
from helpers.compare import assert_same_params
from helpers.models import TINY_DIT, original_animate_state, original_state
from helpers.small_video import SMALL_GENERATE
from safetensors.numpy import save_file

from wanjax.errors import CheckpointError
from wanjax.io.key_layouts import rename_spec, spec_names
from wanjax.io.quant import QuantizedKernel
from wanjax.models.config import TransformerConfig
from wanjax.models.dit import TRANSFORMER, checkpoint_spec, load_transformer
from wanjax.models.dit_layouts import WAN_TRANSFORMER
from wanjax.models.registry import DEMO_TRANSFORMER, released

COMFY = "model.diffusion_model."
# diffusers' single-file conversion has no rule for the FLF2V position table (its conversion script
# does: "img_emb.emb_pos" -> "condition_embedder.image_embedder.pos_embed"), so it keeps the name.
DIFFUSERS_UNCONVERTED = {"img_emb.emb_pos": "condition_embedder.image_embedder.pos_embed"}


def diffusers_kwargs(cfg: TransformerConfig) -> dict:
    """A wanjax transformer config as ``WanTransformer3DModel``'s arguments."""
    return {k: v for k, v in cfg.to_dict().items() if not k.startswith("_")}


@pytest.mark.parametrize("name", [n for n, v in released().items() if v.name not in ("I2V-14B-720P",)])
def test_every_tensor_of_the_real_configs_maps_both_ways(name):
    import diffusers

    v = released()[name]
    cfg = v.transformer
    with torch.device("meta"):
        model = getattr(diffusers, v.transformer_class)(**diffusers_kwargs(cfg))
    theirs = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    ours = spec_names(checkpoint_spec(cfg))
    assert ours == theirs  # every leaf covered, names and shapes
    original = spec_names(rename_spec(checkpoint_spec(cfg), WAN_TRANSFORMER))
    assert len(original) == len(ours)  # the map is one to one
    if cfg.animate:  # the authors' file as stored (4-D biases, fused k/v), which our names view
        stored = original_animate_state({k: np.empty(0, np.float32) for k in theirs})
        converted = convert_wan_transformer_to_diffusers({k: torch.from_numpy(t) for k, t in stored.items()})
    else:
        converted = convert_wan_transformer_to_diffusers({k: torch.empty(0) for k in original})
    back = {DIFFUSERS_UNCONVERTED.get(k, k) for k in converted}
    assert back == set(theirs)


@pytest.fixture(scope="module")
def original_files(tmp_path_factory, tiny_transformer_dir):
    """The tiny transformer as one file in the original layout, and in ComfyUI's prefixed one."""
    root, model = tiny_transformer_dir
    out = tmp_path_factory.mktemp("single")
    files = {"original": out / "wan.safetensors", "comfy": out / "comfy.safetensors"}
    save_file(original_state(model), files["original"])
    save_file(original_state(model, COMFY), files["comfy"])
    return root, model, files


@pytest.mark.parametrize("layout", ["original", "comfy"])
def test_a_file_in_the_original_layout_loads_bit_identically(original_files, layout):
    root, _, files = original_files
    cfg = TRANSFORMER.read_config(root / "transformer")
    ours = load_transformer(files[layout], "float32", config=cfg)
    reference = load_transformer(root, "float32")
    assert_same_params(ours.params, reference.params)


def test_diffusers_reads_the_same_file(original_files):
    root, model, files = original_files
    theirs = WanTransformer3DModel.from_single_file(
        str(files["comfy"]), config=str(root), subfolder="transformer", torch_dtype=torch.float32
    )
    for k, v in model.state_dict().items():
        torch.testing.assert_close(theirs.state_dict()[k], v, rtol=0, atol=0)


def test_a_file_of_another_model_is_named(tmp_path):
    path = tmp_path / "flux.safetensors"
    save_file({"double_blocks.0.img_attn.qkv.weight": np.zeros((4, 4), np.float32)}, path)
    with pytest.raises(CheckpointError, match="not a Wan transformer file"):
        TRANSFORMER.file_weights(path, DEMO_TRANSFORMER)


def fp8_scaled(state: dict[str, np.ndarray], per_channel: bool) -> dict[str, np.ndarray]:
    """``state`` as ComfyUI's fp8-scaled files store it: each 2-D weight in float8_e4m3fn with its
    float32 ``scale_weight`` (absmax / 448, per tensor or per output channel), and the marker."""
    out: dict[str, np.ndarray] = {"scaled_fp8": np.zeros(0, ml_dtypes.float8_e4m3fn)}
    for name, w in state.items():
        if name.endswith(".weight") and w.ndim == 2:
            absmax = np.abs(w).max(axis=1, keepdims=True) if per_channel else np.abs(w).max()
            scale = np.array(absmax / 448, np.float32)
            out[name] = (w / scale).astype(ml_dtypes.float8_e4m3fn)
            out[name.removesuffix("weight") + "scale_weight"] = scale.reshape(-1) if per_channel else scale
        else:
            out[name] = w
    return out


def dequantized(file_state: dict[str, np.ndarray], name: str) -> np.ndarray:
    scale = file_state[name.removesuffix("weight") + "scale_weight"]
    w = file_state[name].astype(np.float32)
    return w * (scale.reshape(-1, 1) if scale.ndim else scale)


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_fp8_scaled_weights_are_dequantized_exactly_or_kept_in_8_bits(tmp_path, original_files, per_channel):
    root, model, _ = original_files
    state = fp8_scaled(original_state(model), per_channel)
    path = tmp_path / "fp8_scaled.safetensors"
    save_file(state, path)
    cfg = TRANSFORMER.read_config(root / "transformer")

    q_name = "blocks.1.self_attn.q.weight"
    ours = load_transformer(path, "float32", config=cfg)
    kernel = np.asarray(ours.params["blocks"]["attn1"]["to_q"]["kernel"])[1]
    np.testing.assert_array_equal(kernel, dequantized(state, q_name).T)
    # the bias next to it, and the float tensors, as stored
    np.testing.assert_array_equal(
        np.asarray(ours.params["blocks"]["attn1"]["to_q"]["bias"])[1], state["blocks.1.self_attn.q.bias"]
    )

    kept = load_transformer(path, "float32", config=cfg, weights_dtype="fp8")
    q = kept.params["blocks"]["attn1"]["to_q"]["kernel"]
    assert isinstance(q, QuantizedKernel)
    values = np.asarray(q.values)[1]
    assert values.dtype == ml_dtypes.float8_e4m3fn
    np.testing.assert_array_equal(values.view(np.uint8), state[q_name].T.view(np.uint8))  # the file's bytes
    np.testing.assert_array_equal(np.asarray(q.dequantize())[1], dequantized(state, q_name).T)


def test_a_scale_of_the_wrong_size_is_refused(tmp_path, original_files):
    _, model, _ = original_files
    state = fp8_scaled(original_state(model), per_channel=True)
    state["blocks.0.self_attn.q.scale_weight"] = np.ones(3, np.float32)
    path = tmp_path / "bad.safetensors"
    save_file(state, path)
    with pytest.raises(CheckpointError, match="3 scales for 24 output channels"):
        TRANSFORMER.file_weights(path, DEMO_TRANSFORMER).open()


def test_tiny_dit_config_is_the_fixture():
    assert TINY_DIT["num_layers"] == 2  # the names above (blocks.1) assume two layers


@pytest.fixture(scope="module")
def gguf_transformer(tmp_path_factory):
    from helpers.gguf_files import GGUF_DIT
    from helpers.models import save_transformer

    root = tmp_path_factory.mktemp("gguf_dit")
    return root, save_transformer(root, seed=4, **{**TINY_DIT, **GGUF_DIT})


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K"])
def test_a_gguf_transformer_holds_the_tensors_diffusers_dequantizes(tmp_path, gguf_transformer, qtype):
    """city96's conventions: original names, matmul weights quantised, the rest float32; wanjax's
    params are diffusers' dequantised tensors, laid out by the one spec."""
    from diffusers import GGUFQuantizationConfig
    from helpers.gguf_files import Q, diffusers_values, write_transformer

    from wanjax.io.checkpoint import ArrayRef, load_params

    root, model = gguf_transformer
    path = write_transformer(tmp_path / f"wan-{qtype}.gguf", original_state(model), Q[qtype])
    cfg = TRANSFORMER.read_config(root / "transformer")

    ours = load_transformer(path, "float32", config=cfg)
    theirs = {k: ArrayRef(v) for k, v in diffusers_values(path).items()}
    expected = load_params(
        theirs, rename_spec(checkpoint_spec(cfg), WAN_TRANSFORMER), np.float32, "diffusers"
    )
    assert_same_params(ours.params, expected)
    # and diffusers itself loads the file as a Wan transformer
    WanTransformer3DModel.from_single_file(
        str(path),
        config=str(root),
        subfolder="transformer",
        quantization_config=GGUFQuantizationConfig(compute_dtype=torch.float32),
    )


# ----------------------------------------------------------------------------------------------
# The CLI: --transformer FILE over --model, or alone (the registry recognises the demo's variant)


def demo_file(tmp_path, folder: str, layout, prefix: str = "", layers: int | None = None):
    """A component of the demo model rewritten as one file named as ``layout`` names its tensors
    (``layers``: the transformer's first blocks only)."""
    from safetensors.numpy import load_file

    from wanjax.pipeline.hub import resolve_model

    directory = resolve_model("demo").path / folder
    state = load_file(next(directory.glob("*.safetensors")))
    if layers is not None:
        state = {
            k: v for k, v in state.items() if not k.startswith("blocks.") or int(k.split(".")[1]) < layers
        }
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"demo_{folder}.safetensors"
    save_file({prefix + layout.file_name(k): v for k, v in state.items()}, path)
    return path


def demo_transformer_file(tmp_path, prefix: str = "", layers: int | None = None):
    return demo_file(tmp_path, "transformer", WAN_TRANSFORMER, prefix, layers)


GENERATE = (
    "generate",
    "--prompt",
    "a cat",
    "--num_inference_steps",
    "2",
    *SMALL_GENERATE,  # the runs compare weights, at any size
)


def run_frames(args: list[str], video) -> np.ndarray:
    """``wanjax`` ``args`` writing ``video``; its frames as made (the PNG contact sheet beside it:
    H.264 would turn a one-level difference in a frame into larger ones)."""
    from PIL import Image

    from wanjax.cli.main import main

    sheet = Path(video).with_suffix(".png")
    assert main([*args, "--output_video", str(video), "--preview", str(sheet)]) == 0
    return np.asarray(Image.open(sheet)).astype(np.int16)


@pytest.mark.slow
def test_generate_with_a_transformer_file_makes_the_same_video(demo_env, tmp_path):
    from wanjax.models.encoder_layouts import WAN_T5_LAYOUT
    from wanjax.models.vae.original_layout import WAN21_VAE_LAYOUT

    file = demo_transformer_file(tmp_path, prefix=COMFY)
    runs = {
        "directory": ["--model", "demo"],
        "files over --model": [
            *("--model", "demo", "--transformer", file),
            *("--vae", demo_file(tmp_path, "vae", WAN21_VAE_LAYOUT)),
            *("--text_encoder", demo_file(tmp_path, "text_encoder", WAN_T5_LAYOUT)),
        ],
        "file alone": ["--transformer", file],
    }
    made = {
        name: run_frames([*GENERATE, *map(str, extra)], tmp_path / f"{name.replace(' ', '_')}.mp4")
        for name, extra in runs.items()
    }
    for name in ("files over --model", "file alone"):
        # the issue's bound, within 1 level (the same weights: identical unless the 8 CPU devices'
        # reductions reorder)
        assert np.abs(made[name] - made["directory"]).max() <= 1, name


@pytest.mark.slow
@pytest.mark.bit_for_bit
def test_generate_with_gguf_and_fp8_scaled_files_makes_their_dequantized_weights_video(demo_env, tmp_path):
    """End to end: the demo transformer as a Q8_0 GGUF (city96's conventions) and as fp8-scaled
    safetensors; each video equals the one from a plain file of the weights diffusers dequantizes
    (GGUF) or the file's ``value x scale`` (fp8): the same frames; the GGUF kept as its blocks
    (``--weights_dtype gguf``) within a level of them."""
    from helpers.gguf_files import Q, diffusers_values, write
    from safetensors.numpy import load_file

    state = load_file(demo_transformer_file(tmp_path / "plain"))  # the original layout's names
    quantised = {k: (Q.Q8_0 if v.ndim == 2 and k.endswith(".weight") else Q.F32, v) for k, v in state.items()}
    gguf_file = write(tmp_path / "demo-Q8_0.gguf", quantised)
    fp8_state = fp8_scaled(state, per_channel=True)
    fp8_file = tmp_path / "demo-fp8-scaled.safetensors"
    save_file(fp8_state, fp8_file)
    scaled = [k for k, v in fp8_state.items() if v.dtype == ml_dtypes.float8_e4m3fn and k.endswith(".weight")]
    references = {
        gguf_file: diffusers_values(gguf_file),
        fp8_file: {**{k: v for k, v in fp8_state.items() if k in state},
                   **{k: dequantized(fp8_state, k) for k in scaled}},
    }  # fmt: skip
    args = [*GENERATE, "--model", "demo", "--quiet"]
    directory = run_frames(args, tmp_path / "directory.mp4")
    for file, values in references.items():
        plain = tmp_path / f"{file.stem}-dequantized.safetensors"
        save_file({k: np.ascontiguousarray(v, np.float32) for k, v in values.items()}, plain)
        ours, reference = (
            run_frames([*args, "--transformer", str(weights)], tmp_path / f"{weights.stem}.mp4")
            for weights in (file, plain)
        )
        assert np.abs(ours - reference).max() == 0, file.name
        if file == gguf_file:  # kept as its blocks on the device (--weights_dtype gguf): within a level
            flags = ["--transformer", str(file), "--weights_dtype", "gguf"]
            assert np.abs(run_frames([*args, *flags], tmp_path / "kept.mp4") - reference).max() <= 1
        assert np.abs(ours - directory).max() > 0  # quantised: not the same


@pytest.mark.slow
def test_the_three_stages_take_component_files_and_pass_them_on(demo_env, tmp_path):
    """encode reads the text encoder and transformer files it is given and records them; denoise
    reads that transformer without being told; decode reads the VAE file it is given: the video is
    generate's with the same files."""
    from wanjax.cli.main import main
    from wanjax.models.encoder_layouts import WAN_T5_LAYOUT
    from wanjax.models.vae.original_layout import WAN21_VAE_LAYOUT
    from wanjax.pipeline import stages

    files = {
        "transformer": demo_transformer_file(tmp_path, prefix=COMFY),
        "text_encoder": demo_file(tmp_path, "text_encoder", WAN_T5_LAYOUT),
        "vae": demo_file(tmp_path, "vae", WAN21_VAE_LAYOUT),
    }
    flag = {name: (f"--{name}", str(path)) for name, path in files.items()}
    steps, stage = ("--num_inference_steps", "2"), tmp_path / "stage"
    encode = [
        "encode",
        "--prompt",
        "a cat",
        *flag["transformer"],
        *flag["text_encoder"],
        *SMALL_GENERATE,
        "--output_dir",
        str(stage),
    ]
    assert main(encode) == 0
    assert main(["denoise", "--input_dir", str(stage), *steps]) == 0
    staged = run_frames(["decode", "--input_dir", str(stage), *flag["vae"]], tmp_path / "staged.mp4")
    config = stages.read_config(stage)["stages"]
    absolute = {name: str(path.resolve()) for name, path in files.items()}
    assert config["encode"]["component_files"] == {k: absolute[k] for k in ("transformer", "text_encoder")}
    assert config["denoise"]["component_files"] == config["encode"]["component_files"]  # read from encode's
    assert config["decode"]["component_files"] == absolute
    generate = [*GENERATE, *(f for pair in flag.values() for f in pair)]
    assert np.abs(staged - run_frames(generate, tmp_path / "generate.mp4")).max() <= 1


def test_plan_takes_component_files(demo_env, tmp_path, capsys):
    """plan of a transformer file is the plan of its variant; a file that does not fit the variant
    asked for is one line, exit 2."""
    from wanjax.cli.main import main

    size = ["--height", "64", "--width", "64", "--frames", "5", "--num_devices", "1"]
    assert main(["plan", "--model", "demo", *size]) == 0
    by_name = capsys.readouterr().out
    assert main(["plan", "--transformer", str(demo_transformer_file(tmp_path)), *size]) == 0
    assert capsys.readouterr().out == by_name and by_name.startswith("demo: 64x64")
    bad = {
        "--transformer": (
            demo_transformer_file(tmp_path / "3", layers=3),
            "which does not fit demo's transformer",
        ),
        "--transformer_2": (demo_transformer_file(tmp_path), "demo has no transformer_2"),
    }
    for flag, (file, words) in bad.items():
        assert main(["plan", "--model", "demo", flag, str(file), *size]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err


def test_a_transformer_file_of_no_known_variant_is_one_line(demo_env, tmp_path, capsys):
    from wanjax.cli.main import main

    file = demo_transformer_file(tmp_path, layers=3)  # the demo has 4 layers
    assert main(["generate", "--prompt", "a cat", "--transformer", str(file)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1 and "transformer in the Wan original layout, but of no variant wanjax knows" in err[0]
    )
    assert main(["generate", "--prompt", "a cat", "--model", "demo", "--transformer", str(file)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not fit" in err[0], err


def test_info_describes_a_component_file(demo_env, tmp_path, capsys):
    from wanjax.cli.main import main

    file = demo_transformer_file(tmp_path, prefix=COMFY)
    assert main(["info", str(file)]) == 0
    out = capsys.readouterr().out
    assert f"{file}: Wan transformer (demo, " in out
    assert "Wan original layout, names prefixed 'model.diffusion_model.'" in out
    assert "stored: float32 x" in out


def test_a_file_of_another_model_on_the_command_line_is_one_line(demo_env, tmp_path, capsys):
    from wanjax.cli.main import main

    path = tmp_path / "flux.safetensors"
    save_file({"double_blocks.0.img_attn.qkv.weight": np.zeros((4, 4), np.float32)}, path)
    for args in (
        ["generate", "--prompt", "a cat", "--model", "demo", "--transformer", str(path)],
        ["info", str(path)],
    ):
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "not a Wan" in err[0], err


def test_convert_writes_a_diffusers_directory_of_the_same_weights(demo_env, tmp_path, capsys):
    """An fp8-scaled ComfyUI file over the demo: a whole diffusers model whose transformer diffusers
    loads and whose weights are the file's, dequantised (float32: exactly)."""
    from wanjax.cli.main import main
    from wanjax.pipeline.hub import resolve_model

    state = fp8_scaled(
        {COMFY + WAN_TRANSFORMER.file_name(k): v for k, v in demo_state().items()}, per_channel=False
    )
    file = tmp_path / "fp8_scaled.safetensors"
    save_file(state, file)
    out = tmp_path / "converted"
    args = ["convert", str(out), "--model", "demo", "--transformer", str(file), "--dtype", "float32"]
    assert main(args) == 0
    demo = resolve_model("demo").path
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in demo.iterdir())
    cfg = TRANSFORMER.read_config(out / "transformer")
    ours = load_transformer(out, "float32")
    from_file = load_transformer(file, "float32", config=cfg)
    assert_same_params(ours.params, from_file.params)
    theirs = WanTransformer3DModel.from_pretrained(out / "transformer").state_dict()
    q = "blocks.0.attn1.to_q.weight"
    np.testing.assert_array_equal(theirs[q].numpy(), dequantized(state, COMFY + WAN_TRANSFORMER.file_name(q)))
    assert main(args) == 2  # the output exists now
    assert "exists; give a new directory" in capsys.readouterr().err


def test_what_convert_writes_without_a_model_says_what_it_is_and_how_to_use_it(demo_env, tmp_path, capsys):
    """``convert`` without ``--model`` writes the component's folder alone: ``info`` of it says what it
    holds and how to use it (exit 0, its component described); given as ``--model`` (the directory,
    or its weights file) it is one line naming the flag it goes to, exit 2, nothing written."""
    from wanjax.cli.main import main

    out = tmp_path / "converted"
    file = demo_transformer_file(tmp_path, prefix=COMFY)
    assert main(["convert", str(out), "--transformer", str(file)]) == 0
    weights = out / "transformer" / "diffusion_pytorch_model.safetensors"
    holds = "a Wan transformer (demo, "  # the variants the file is recognised as (info's own words)
    use = f"give it as --transformer {weights} (with --model for the rest)"
    assert use in capsys.readouterr().out  # said when written too
    assert main(["info", str(out)]) == 0
    shown = capsys.readouterr().out
    header = shown.splitlines()[0]
    assert header.startswith(f"{out} holds component folders, not a whole model (no model_index.json): ")
    assert f"transformer/ with {holds}" in header and "diffusers layout" in header
    assert f"as `wanjax convert` writes without --model; {use}, or convert again with --model" in header
    assert "[transformer]" in shown and "weights: 123 tensors" in shown
    for model, starts in ((out, header), (weights, f"{weights} is a weights file, not a model: {holds}")):
        video = tmp_path / "video" / "v.mp4"
        args = ["generate", "--model", str(model), "--prompt", "a cat", "--output_video", str(video)]
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"wanjax: error: {starts}"), err
        assert use in err[0] and not video.parent.exists()


def demo_state() -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    from wanjax.pipeline.hub import resolve_model

    return load_file(resolve_model("demo").path / "transformer" / "diffusion_pytorch_model.safetensors")
