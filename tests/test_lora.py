"""LoRA adapters merged into the transformer, against diffusers: ``load_lora_weights`` +
``set_adapters`` + ``fuse_lora`` on the same checkpoint give the merged weights (float32, 1e-6), and a
pipeline run with them gives diffusers' latents; on 8 devices the merged shards equal the one-device
merge; bad files are one-line errors before any weight is read. Expected values come from diffusers.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers.lora import _Pipe, add_factors, peft_transformer, wan_original
from helpers.models import TINY_DIT, save_transformer
from safetensors.torch import save_file

pytest.importorskip("peft")

from peft import LoraConfig

from wanjax import load_transformer
from wanjax.errors import CheckpointError
from wanjax.io.checkpoint import LeafSource
from wanjax.models import dit

SCALES = (0.5, 1.3)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny transformer checkpoint and two LoRAs for it: one diffusers/PEFT file as
    ``save_lora_weights`` writes it (metadata, alpha != rank), one original-Wan file with alphas."""
    from diffusers import WanPipeline as DiffusersPipeline

    root = tmp_path_factory.mktemp("lora_dit")
    save_transformer(root, seed=0, **TINY_DIT)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["to_q", "to_v", "ffn.net.0.proj", "proj_out"])
    peft_model = peft_transformer(config, seed=7)
    from peft.utils import get_peft_model_state_dict

    DiffusersPipeline.save_lora_weights(
        root / "peft",
        transformer_lora_layers=get_peft_model_state_dict(peft_model),
        transformer_lora_adapter_metadata=config.to_dict(),
    )
    wan = wan_original(torch.Generator().manual_seed(9))
    save_file(wan, root / "wan.safetensors")
    return root, root / "peft" / "pytorch_lora_weights.safetensors", root / "wan.safetensors"


def diffusers_fused(root, loras) -> dict[str, np.ndarray]:
    """The transformer's state dict after diffusers loads ``[(file, weight), ...]`` and fuses them."""
    from diffusers import WanTransformer3DModel

    model = WanTransformer3DModel.from_pretrained(root / "transformer").eval()
    pipe = _Pipe(model)
    names = []
    for k, (path, _) in enumerate(loras):
        pipe.load_lora_weights(str(path), adapter_name=f"a{k}")
        names.append(f"a{k}")
    pipe.set_adapters(names, [w for _, w in loras])
    pipe.fuse_lora(adapter_names=names)
    pipe.unload_lora_weights()
    return {k: v.numpy() for k, v in model.state_dict().items()}


def layers(model):
    """``(checkpoint tensor name, its source, our array of it)`` for every tensor of the model."""
    import jax

    sources = jax.tree.leaves(dit.checkpoint_spec(model.cfg), is_leaf=lambda x: isinstance(x, LeafSource))
    for source, leaf in zip(sources, jax.tree.leaves(model.params), strict=True):
        leaf = np.asarray(leaf)
        for layer, name in enumerate(source.names):
            yield name, source, leaf[layer] if source.stacked else leaf


def snapshot(model) -> dict[str, np.ndarray]:
    return {name: value for name, _, value in layers(model)}


def assert_equal_to(model, expected: dict[str, np.ndarray]) -> None:
    """Our weights equal ``expected`` (diffusers' state dict, put in our layout by the spec's own layout)."""
    names = set()
    for name, source, value in layers(model):
        names.add(name)
        np.testing.assert_allclose(value, source.layout(expected[name]), rtol=1e-6, atol=1e-6, err_msg=name)
    assert names == set(expected)


@pytest.mark.parametrize("which", ["peft", "wan", "both"])
def test_merged_weights_equal_diffusers_fuse(files, which):
    root, peft_file, wan_file = files
    loras = {
        "peft": [(peft_file, 1.3)],
        "wan": [(wan_file, 0.5)],
        "both": [(peft_file, 0.5), (wan_file, 1.3)],
    }[which]
    model = load_transformer(root, "float32")
    base = snapshot(model)
    model.set_loras(loras)
    fused = diffusers_fused(root, loras)
    sources = {name: source for name, source, _ in layers(model)}
    changed = [n for n in fused if not np.array_equal(sources[n].layout(fused[n]), base[n])]
    assert len(changed) >= 4, changed
    assert_equal_to(model, fused)


def test_set_loras_remerges_from_the_kept_base(files):
    """Changing the adapters rebuilds the changed leaves from their base (no checkpoint read); [] restores it."""
    root, peft_file, wan_file = files
    model = load_transformer(root, "float32")
    base = snapshot(model)
    model.set_loras([(peft_file, 0.5), (wan_file, 1.3)])
    model.set_loras([(wan_file, 0.8)])
    assert_equal_to(model, diffusers_fused(root, [(wan_file, 0.8)]))
    model.set_loras([])
    assert all(np.array_equal(v, base[k]) for k, v in snapshot(model).items())
    assert model._lora_base == {} and model.loras == []


def test_a_merged_cache_puts_sets_back_as_merged_and_the_base_exactly(files):
    """Switching between adapter sets with a cache: each set's weights equal a fresh merge of it, a set
    used before is taken from the cache (its very arrays, nothing merged), [] gives the base bit for
    bit; a set larger than the budget is not kept."""
    from wanjax.models.lora import MergedCache, leaves_at, load_loras, set_key

    root, peft_file, wan_file = files
    wan, peft = [(wan_file, 0.8)], [(peft_file, 0.5), (wan_file, 1.3)]
    fresh = load_transformer(root, "float32")
    base = snapshot(fresh)
    want = {}
    for loras in (wan, peft):
        fresh.set_loras(loras)
        want[set_key(load_loras(loras))] = snapshot(fresh)
    model, cache = load_transformer(root, "float32"), MergedCache(budget=1 << 30)
    for loras in (wan, peft, wan, [], peft, wan):
        key = set_key(load_loras(loras))
        cached = cache.get(key)
        model.set_loras(loras, cache)
        got, expected = snapshot(model), want.get(key, base)
        assert got.keys() == expected.keys() and all(np.array_equal(got[k], expected[k]) for k in got), key
        if cached is not None:
            assert all(
                a is b for a, b in zip(leaves_at(model.params, cached).values(), cached.values(), strict=True)
            )
    assert len(cache) == 2 and model.loras == [(wan_file, 0.8)]
    model.set_loras([], MergedCache(budget=1))
    assert all(np.array_equal(v, base[k]) for k, v in snapshot(model).items())
    small = MergedCache(budget=1)
    model.set_loras(wan, small)
    assert len(small) == 0


def test_bad_lora_files_fail_before_merging(files, tmp_path):
    root, peft_file, _ = files
    model = load_transformer(root, "float32")
    before = snapshot(model)
    other = {}
    add_factors(other, torch.Generator().manual_seed(1), "diffusion_model.blocks.0.self_attn.q", (48, 48), 4)
    save_file(other, tmp_path / "wider.safetensors")  # a LoRA for a wider model
    deeper = {}
    add_factors(deeper, torch.Generator().manual_seed(1), "diffusion_model.blocks.7.self_attn.q", (24, 24), 4)
    save_file(deeper, tmp_path / "deeper.safetensors")  # for a model with more blocks
    for path, message in (
        (tmp_path / "wider.safetensors", r"blocks.0.attn1.to_q: a LoRA update of shape \(48, 48\)"),
        (tmp_path / "deeper.safetensors", r"blocks.7.attn1.to_q matches no parameter of this model \(0 of 1"),
    ):
        with pytest.raises(CheckpointError, match=message) as info:
            model.set_loras([(peft_file, 1.0), (path, 1.0)])
        assert "\n" not in str(info.value)
    assert all(np.array_equal(v, before[k]) for k, v in snapshot(model).items())


def test_merge_on_an_8_device_mesh_equals_one_device(files):
    import jax

    from wanjax.parallel.mesh import make_mesh, parse_mesh

    root, peft_file, wan_file = files
    loras = [(str(peft_file), 0.5), (str(wan_file), 1.3)]
    one = load_transformer(root, "float32")
    one.set_loras(loras)
    for mesh, fsdp in (("dp=2,sp=2,tp=2", True), ("dp=1,sp=4,tp=2", False)):
        model = load_transformer(root, "float32", mesh=make_mesh(parse_mesh(mesh)), fsdp=fsdp)
        model.set_loras(loras)
        worst = max(
            float(np.abs(np.asarray(a) - np.asarray(b)).max())
            for a, b in zip(jax.tree.leaves(model.params), jax.tree.leaves(one.params), strict=True)
        )
        q = model.params["blocks"]["attn1"]["to_q"]["kernel"]
        assert len(q.sharding.device_set) == 8 and str(q.sharding.spec) != "PartitionSpec()", (
            mesh,
            q.sharding,
        )
        assert worst <= 1e-6, (mesh, worst)


# ----------------------------------------------------------------------------------------------
# A pipeline run with LoRAs, from the command line


@pytest.fixture(scope="module")
def tiny_pipeline(tiny_pipeline_dir, tmp_path_factory):
    """The tiny random WanPipeline, two LoRAs for its transformer (block projections: original Wan
    names with alphas, and lora_A / lora_B names) and starting noise, in a folder of their own."""
    root = tmp_path_factory.mktemp("lora_files")
    loras = []
    for k, names in enumerate((("lora_down", "lora_up"), ("lora_A", "lora_B"))):
        sd = {}
        gen = torch.Generator().manual_seed(20 + k)
        for i in range(2):
            for module, shape in {
                "self_attn.q": (24, 24),
                "cross_attn.v": (24, 24),
                "ffn.0": (32, 24),
            }.items():
                key = f"diffusion_model.blocks.{i}.{module}"
                add_factors(sd, gen, key, shape, 4, alpha=2.0 if k == 0 else None, names=names)
        save_file(sd, root / f"lora{k}.safetensors")
        loras.append(root / f"lora{k}.safetensors")
    noise = torch.randn((1, 16, 3, 6, 8), generator=torch.Generator().manual_seed(0))
    save_file({"latents": noise}, root / "noise.safetensors")
    return tiny_pipeline_dir, loras, noise, root / "noise.safetensors"


@pytest.mark.slow
def test_generate_with_two_loras_equals_diffusers(tiny_pipeline, tmp_path):
    from diffusers import WanPipeline as DiffusersPipeline
    from helpers.compare import relative_error, to_uint8
    from helpers.pipelines import NEGATIVE, PROMPT

    from wanjax.cli.main import main

    root, (first, second), noise, noise_file = tiny_pipeline
    weights = (0.8, 1.2)
    pipe = DiffusersPipeline.from_pretrained(root)
    pipe.load_lora_weights(str(first), adapter_name="a")
    pipe.load_lora_weights(str(second), adapter_name="b")
    pipe.set_adapters(["a", "b"], list(weights))
    pipe.fuse_lora(adapter_names=["a", "b"])
    final = []
    run = dict(
        prompt=PROMPT, negative_prompt=NEGATIVE, height=48, width=64, num_frames=9, num_inference_steps=4
    )
    with torch.no_grad():
        video = pipe(
            **run,
            guidance_scale=5.0,
            latents=noise,
            output_type="np",
            callback_on_step_end=lambda p, i, t, kw: final.append(kw["latents"].clone()) or {},
        ).frames
    reference = to_uint8(video)

    stage = tmp_path / "stages"
    common = ["--model", str(root), "--dtype", "float32"]
    lora = ["--lora", f"{first}:{weights[0]}", "--lora", f"{second}:{weights[1]}"]
    video_flags = ["--height", "48", "--width", "64", "--frames", "9"]
    assert (
        main(
            ["encode", *common, "--prompt", PROMPT, "--negative_prompt", NEGATIVE, "--output_dir", str(stage)]
        )
        == 0
    )
    steps = [
        "--num_inference_steps",
        "4",
        "--guidance_scale",
        "5",
        "--init_latents",
        str(noise_file),
    ]
    assert main(["denoise", "--input_dir", str(stage), *lora, *steps]) == 0
    from safetensors.numpy import load_file

    latents = load_file(stage / "stage2_latents.safetensors")["latents"]
    assert relative_error(latents, final[-1].numpy()) <= 1e-5
    config = json.loads((stage / "generation_config.json").read_text())
    assert config["stages"]["denoise"]["arguments"]["lora"] == [
        f"{first}:{weights[0]}",
        f"{second}:{weights[1]}",
    ]

    frames_file = tmp_path / "frames.npy"
    args = [
        "generate",
        *common,
        "--prompt",
        PROMPT,
        "--negative_prompt",
        NEGATIVE,
        *video_flags,
        *steps,
        *lora,
    ]
    assert main([*args, "--output_video", str(tmp_path / "v.mp4"), "--frames_out", str(frames_file)]) == 0
    frames = np.load(frames_file)
    assert np.abs(frames.astype(np.int16) - reference).max() <= 1
    record = json.loads((tmp_path / "v.json").read_text())
    assert record["arguments"]["lora"] == [f"{first}:{weights[0]}", f"{second}:{weights[1]}"]


def test_cli_bad_lora_files_are_one_line_errors_before_any_weight(tiny_pipeline, tmp_path, capsys):
    from wanjax.cli.main import main

    root, (first, _), _, _ = tiny_pipeline
    (tmp_path / "lora.bin").write_bytes(b"\x80\x04not really")
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(first.read_bytes()[:-100])
    wide = {}
    add_factors(wide, torch.Generator().manual_seed(1), "diffusion_model.blocks.0.self_attn.q", (48, 48), 4)
    save_file(wide, tmp_path / "wide.safetensors")
    save_file({"vae.decoder.lora_A.weight": torch.zeros(2, 2)}, tmp_path / "nothing.safetensors")
    base = [
        "generate",
        "--model",
        str(root),
        "--prompt",
        "a cat",
        "--height",
        "48",
        "--width",
        "64",
        "--frames",
        "9",
    ]
    capsys.readouterr()
    for bad, message in (
        (tmp_path / "lora.bin", "pickle"),
        (truncated, "truncated"),
        (tmp_path / "wide.safetensors", "another model size"),
        (tmp_path / "nothing.safetensors", "0 of 1 keys recognised"),
        (f"{first}:abc:", "cannot read"),
    ):
        out = tmp_path / "never.mp4"
        assert main([*base, "--lora", str(bad), "--output_video", str(out)]) == 2, bad
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err
        assert not out.exists()


def test_info_on_a_lora_file(tiny_pipeline, capsys):
    from wanjax.cli.main import main

    _, (first, _), _, _ = tiny_pipeline
    assert main(["info", str(first)]) == 0
    out = capsys.readouterr().out
    assert f"{first}: LoRA, wan-original layout, 6 modules" in out
    assert "ranks: 4" in out and "alphas: 2" in out
    assert "attn1.to_q x2, attn2.to_v x2, ffn.net.0.proj x2" in out


# ----------------------------------------------------------------------------------------------
# LoRAs on 8-bit weights: merged in float32 into the dequantised kernel, requantised per channel


@pytest.mark.parametrize("weights", ["int8", "fp8"])
def test_a_lora_merges_into_8_bit_weights_as_the_merged_model_quantised(files, weights):
    """Each changed kernel is ``quantize(dequantize(base) + delta)`` (the host rule, to one 8-bit step
    where the device's float32 sum rounds across a boundary), so its error against the float merge is
    that of two independent roundings: the base's, and the merged weight's; ``set_loras([])``
    restores the 8-bit base exactly."""
    import jax

    from wanjax.io.quant import QuantizedKernel, dequantize, quantize

    root, peft_file, wan_file = files
    loras = [(peft_file, 0.5), (wan_file, 1.3)]
    float_model = load_transformer(root, "float32")
    float_base = snapshot(float_model)
    float_model.set_loras(loras)
    float_merged = snapshot(float_model)

    model = load_transformer(root, "float32", weights_dtype=weights)
    is_kernel = lambda x: isinstance(x, QuantizedKernel)  # noqa: E731
    before = [np.asarray(x) for x in jax.tree.leaves(model.params)]
    model.set_loras(loras)
    sources = jax.tree.leaves(dit.checkpoint_spec(model.cfg), is_leaf=lambda x: isinstance(x, LeafSource))
    squared = {"merged": 0.0, "base": 0.0, "requantised": 0.0, "weights": 0.0}
    for source, leaf in zip(sources, jax.tree.leaves(model.params, is_leaf=is_kernel), strict=True):
        if not isinstance(leaf, QuantizedKernel) or not source.stacked:
            continue
        qdtype = np.asarray(leaf.values).dtype
        ours = dequantize(np.asarray(leaf.values), np.asarray(leaf.scale))
        for layer, name in enumerate(source.names):
            merged, base = float_merged[name], float_base[name]
            if np.array_equal(merged, base):
                continue
            base_8bit = dequantize(*quantize(base, qdtype))
            expected = dequantize(*quantize(base_8bit + (merged - base), qdtype))
            step = np.asarray(leaf.scale)[layer] * (1 if weights == "int8" else 32)  # e4m3's widest gap
            # one step where the device's float32 merge rounds across a boundary: int8's channel maximum
            # sits on a tie (127.5 steps), which an ulp of the merged sum decides, with the scales an
            # ulp apart too (128 s' against 127 s: a step and 127 ulps of it)
            assert np.all(np.abs(ours[layer] - expected) <= step * (1 + 2e-5)), name
            squared["merged"] += ((ours[layer] - merged) ** 2).sum()
            squared["base"] += ((base_8bit - base) ** 2).sum()
            squared["requantised"] += ((dequantize(*quantize(merged, qdtype)) - merged) ** 2).sum()
            squared["weights"] += (merged**2).sum()
    assert squared["weights"] > 0
    error = {k: np.sqrt(v / squared["weights"]) for k, v in squared.items() if k != "weights"}
    assert error["merged"] <= 1.05 * np.hypot(error["base"], error["requantised"]), error

    model.set_loras([])
    after = [np.asarray(x) for x in jax.tree.leaves(model.params)]
    assert all(a.tobytes() == b.tobytes() for a, b in zip(after, before, strict=True))
