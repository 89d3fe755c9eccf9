"""``wanjax plan``: per-device memory from abstract shapes, with a verdict against the device memory."""

from __future__ import annotations

import dataclasses
import re

import jax

from wanjax.chips import GiB
from wanjax.cli.main import main
from wanjax.io.checkpoint import abstract_params
from wanjax.models import dit, umt5
from wanjax.models.registry import CLIP_VIT_H_14, transformer_preset
from wanjax.parallel.mesh import parse_mesh
from wanjax.planning.models import model_configs
from wanjax.planning.plan import plan

ARGS = ["plan", "--model", "14B", "--height", "720", "--width", "1280", "--frames", "81"]


def test_14b_720p_on_8_devices_names_a_fitting_mesh(capsys):
    assert main([*ARGS, "--num_devices", "8", "--device_memory", "32GiB"]) == 0
    out = capsys.readouterr().out
    assert "14B: 1280x720, 81 frames, 8 devices" in out
    suggested = re.search(r"suggested: --mesh (\S+) \(peak ([\d.]+) GiB\)", out)
    assert suggested and suggested.group(1) == "dp=2,sp=1,tp=4", out
    assert float(suggested.group(2)) < 0.9 * 32
    verdicts = re.findall(r"mesh (\S+):\n(?:.*\n){3}.*: (fits|does NOT fit)", out)
    assert len(verdicts) == 10  # every (dp, sp, tp) factorisation of 8
    assert dict(verdicts)["dp=8,sp=1,tp=1"] == "does NOT fit"  # 14B replicated: 27 GiB of weights alone


def test_a_non_fitting_mesh_is_reported(capsys):
    assert main([*ARGS, "--mesh", "dp=8,sp=1,tp=1", "--device_memory", "32GiB"]) == 1
    out = capsys.readouterr().out
    assert "does NOT fit" in out and "dp=8,sp=1,tp=1" in out
    assert main([*ARGS, "--mesh", "dp=2,sp=1,tp=4", "--device_memory", "32GiB"]) == 0
    assert main([*ARGS, "--mesh", "dp=2,sp=1,tp=4", "--device_memory", "8GiB"]) == 1


def test_weights_per_device_follow_the_rules():
    model = model_configs("14B")
    abstract = abstract_params(dit.checkpoint_spec(transformer_preset("14B")), "bfloat16")
    total = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(abstract))
    kwargs = dict(height=720, width=1280, frames=81, device_memory=32 * GiB)
    one = plan(model, parse_mesh("dp=1,sp=1,tp=1"), **kwargs)
    four = plan(model, parse_mesh("dp=2,sp=1,tp=4"), **kwargs)
    fsdp = plan(model, parse_mesh("dp=2,sp=1,tp=4", fsdp=True), **kwargs)
    assert one.stages["denoise"].weights == total  # float32-kept leaves included
    assert total / 4 <= four.stages["denoise"].weights < 1.01 * total / 4
    assert fsdp.stages["denoise"].weights < 0.51 * four.stages["denoise"].weights
    # sequence parallelism shrinks the DiT activations, spatial sharding the VAE's
    sp = plan(model, parse_mesh("dp=1,sp=8,tp=1"), **kwargs)
    assert sp.stages["denoise"].activations < one.stages["denoise"].activations / 4
    # (eight strips, each device also holding the one whole frame the partitioner gathers)
    assert one.stages["decode"].activations / 8 < sp.stages["decode"].activations
    assert sp.stages["decode"].activations < one.stages["decode"].activations / 6


def test_bad_plan_flags_are_one_line_errors(capsys):
    assert main([*ARGS, "--mesh", "dp=2,tp=2", "--num_devices", "8"]) == 2
    assert main([*ARGS, "--num_devices", "8", "--device_memory", "lots"]) == 2
    assert main(["plan", "--model", "nope", "--num_devices", "8"]) == 2
    assert main([*ARGS, "--num_devices", "8", "--cache", "firstblock"]) == 2  # compiled, not estimated
    assert main([*ARGS, "--num_devices", "8", "--cache_calibrate", "ratios.json"]) == 2
    err = capsys.readouterr().err
    assert err.count("wanjax: error:") == 5 and len(err.strip().splitlines()) == 5
    assert "--cache firstblock needs --compile SLICE" in err and "drop --cache_calibrate" in err


def test_vae_decode_activations_include_the_causal_cache():
    """The causal cache dominates the decoder's live set: on accelerators a three-frame ring of every
    causal conv's input, ~1.3 GiB at 240x416 (1.5x the two-frame cache: the 830 MiB measured in
    BENCHMARKS.md plus conv_out's 96-channel site)."""
    from wanjax.models.vae.config import VAEConfig
    from wanjax.planning.plan import vae_cache_bytes

    assert 1.25 * GiB < vae_cache_bytes(VAEConfig(), 240, 416) < 1.4 * GiB
    model = model_configs("14B")
    kwargs = dict(height=720, width=1280, frames=81, device_memory=32 * GiB)
    eight = plan(model, parse_mesh("dp=2,sp=1,tp=4"), **kwargs)
    assert eight.stages["decode"].activations > vae_cache_bytes(model.vae, 720, 1280) / 8


def test_a_tpus_lanes_pad_the_vae_feature_maps():
    """A TPU pads an array's channels to its 128 lanes: the Wan 2.1 decoder's 96- and 192-channel maps
    (the 720p cache's largest) count a third more; 384 channels and a 128-wide VAE nothing."""
    from wanjax.chips import TPU_LANES
    from wanjax.models.vae.config import VAEConfig
    from wanjax.planning.plan import lane_padded, vae_cache_bytes

    assert [lane_padded(c, TPU_LANES) for c in (3, 96, 128, 192, 384)] == [128, 128, 128, 256, 384]
    wan = VAEConfig()
    ratio = vae_cache_bytes(wan, 720, 1280, lanes=TPU_LANES) / vae_cache_bytes(wan, 720, 1280)
    assert 1.2 < ratio < 4 / 3
    wide = dataclasses.replace(
        wan, base_dim=128, z_dim=128, latents_mean=(0.0,) * 128, latents_std=(1.0,) * 128
    )
    assert vae_cache_bytes(wide, 240, 416, lanes=TPU_LANES) == vae_cache_bytes(wide, 240, 416)
    model, mesh = model_configs("14B"), parse_mesh("dp=2,sp=1,tp=4")
    kwargs = dict(height=720, width=1280, frames=81, device_memory=32 * GiB)
    tpu, gpu = (plan(model, mesh, **kwargs, lanes=lanes) for lanes in (TPU_LANES, 1))
    assert tpu.stages["denoise"] == gpu.stages["denoise"]
    assert 1.2 < tpu.stages["decode"].activations / gpu.stages["decode"].activations < 4 / 3


def test_a_v7x_plan_counts_the_compilers_copy_of_the_16_bit_stacks():
    """On v7x the TPU compiler copies the stacked 16-bit matmul kernels the step reads into another
    tiling (BENCHMARKS.md: +1.39 GiB per 10 of the 14B's layers on dp=2,tp=4 = 6 of its 5120x5120
    kernels and its two FFN kernels a layer, split over tp=4; the cross-attention's context
    projections are the text K/V cache's, unread); 8-bit kernels, streamed layers and other TPUs: none."""
    from wanjax.target import Target

    assert Target("tpu", "TPU7x").copies_16bit_stacks
    assert not any(Target(p, k).copies_16bit_stacks for p, k in [("tpu", "TPU v6 lite"), ("cpu", "cpu")])
    model, mesh = model_configs("14B"), parse_mesh("dp=2,sp=1,tp=4")
    kwargs = dict(height=720, width=1280, frames=81, device_memory=96 * GiB, lanes=128)

    def extra(**mode) -> int:
        v7x, v6e = (plan(model, mesh, **kwargs, **mode, copies_stacks=c) for c in (True, False))
        return v7x.on_device("denoise") - v6e.on_device("denoise")

    per_layer = (6 * 5120 * 5120 + 2 * 5120 * 13824) * 2 // 4
    assert extra() == 40 * per_layer  # 5.57 GiB
    assert extra(offload="model") == 40 * (per_layer + 2 * 5120 * 5120 * 2 // 4)  # no K/V cache
    assert extra(weights_dtype="int8") == extra(offload="blocks") == 0


def test_vae_strips_are_the_pipelines():
    """The decode (and an image model's encode) splits over as many strips as the pipeline's
    ``spatial_sharding`` cuts: 480x848 (latents 60x106) on dp=2,sp=2,tp=2 is 4 strips along H
    (106 columns split 2 ways at most, 60 rows 4 ways), not all 8 devices."""
    from wanjax.parallel.layouts import strip_count

    mesh = parse_mesh("dp=2,sp=2,tp=2")
    assert strip_count(mesh.sizes, (60, 106)) == 4 and strip_count(mesh.sizes, (60, 104)) == 8
    assert strip_count(mesh.sizes, (1, 3)) == 1  # strips of at least 2 pixels: none here
    kwargs = dict(height=480, width=848, frames=81, device_memory=32 * GiB)
    for name in ("1.3B", "I2V-14B"):
        model = model_configs(name)
        four, eight = plan(model, parse_mesh("dp=1,sp=4,tp=1"), **kwargs), plan(model, mesh, **kwargs)
        assert four.stages["decode"].activations == eight.stages["decode"].activations
        assert (
            four.stages["decode"].activations
            < plan(model, parse_mesh(ONE), **kwargs).stages["decode"].activations / 3
        )


# ----------------------------------------------------------------------------------------------
# --offload none|model|blocks, --weights_dtype bf16|int8|fp8

ONE = "dp=1,sp=1,tp=1"
P480 = dict(height=480, width=832, frames=81)


def leaves_with_paths(tree):
    return [
        ("/".join(str(k.key) for k in path), leaf)
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    ]


def nbytes(leaf) -> int:
    return leaf.size * leaf.dtype.itemsize


def test_quantizable_leaves_are_the_matmul_kernels():
    """Every ``kernel`` of a linear layer (2-D, or 3-D stacked), but not the float32-kept time
    embedder's nor the patch embedding's conv kernel; no norm, bias, embedding or modulation table."""
    from wanjax.io.checkpoint import LeafSource
    from wanjax.io.quantizable import is_quantizable, scale_shape
    from wanjax.models import umt5
    from wanjax.models.registry import UMT5_XXL

    def quantizable(spec):
        flat = jax.tree_util.tree_flatten_with_path(spec, is_leaf=lambda x: isinstance(x, LeafSource))[0]
        return {"/".join(str(k.key) for k in path) for path, s in flat if is_quantizable(s)}, flat

    names, flat = quantizable(dit.checkpoint_spec(transformer_preset("14B")))
    kernels = {
        *(f"blocks/{a}/{p}/kernel" for a in ("attn1", "attn2") for p in ("to_q", "to_k", "to_v", "to_out")),
        "blocks/ffn/proj_in/kernel",
        "blocks/ffn/proj_out/kernel",
        "time_proj/kernel",
        "text_embedder/linear_1/kernel",
        "text_embedder/linear_2/kernel",
        "proj_out/kernel",
    }
    assert names == kernels
    scales = {"/".join(str(k.key) for k in path): scale_shape(s) for path, s in flat if is_quantizable(s)}
    assert scales["blocks/ffn/proj_in/kernel"] == (40, 13824)  # (layers, out)
    assert scales["time_proj/kernel"] == (6 * 5120,)
    names, _ = quantizable(umt5.checkpoint_spec(UMT5_XXL))
    assert names == {f"layers/{p}/kernel" for p in ("q", "k", "v", "o", "wi_0", "wi_1", "wo")}


def test_8bit_weights_are_one_byte_per_element_and_a_float32_scale_per_output_channel():
    """Computed from the abstract params: a quantisable kernel ``(..., in, out)`` takes ``size`` bytes
    plus 4 per ``size / in`` scales; every other leaf stays in its dtype. Under tp=4 the scale splits
    as the kernel's output axis: Q/K/V and FFN-in (column-parallel) by 4, the row-parallel output
    projections not at all."""
    model = model_configs("14B")
    spec = dit.checkpoint_spec(model.transformer)
    abstract = leaves_with_paths(abstract_params(spec, "bfloat16"))
    quantized = {
        name
        for name, leaf in abstract
        if name.endswith("kernel") and not name.startswith(("patch_embedding", "time_embedder"))
    }
    assert len(quantized) == 14
    kwargs = dict(**P480, device_memory=24 * GiB)
    for weights in ("int8", "fp8"):
        expected = sum(
            (leaf.size + 4 * leaf.size // leaf.shape[-2]) if name in quantized else nbytes(leaf)
            for name, leaf in abstract
        )
        got = plan(model, parse_mesh(ONE), weights_dtype=weights, **kwargs)
        assert got.stages["denoise"].weights == expected
        assert got.stages["decode"].weights == plan(model, parse_mesh(ONE), **kwargs).stages["decode"].weights

    column = ("to_q", "to_k", "to_v", "proj_in", "time_proj", "text_embedder/linear_1")
    row = ("to_out", "ffn/proj_out", "text_embedder/linear_2")
    tp4 = 0
    for name, leaf in abstract:
        if name not in quantized:
            continue
        scales = leaf.size // leaf.shape[-2]
        if any(c in name for c in column):
            tp4 += leaf.size // 4 + 4 * scales // 4
        elif any(r in name for r in row):
            tp4 += leaf.size // 4 + 4 * scales
        else:  # proj_out: (embed, None), whole without FSDP
            assert name == "proj_out/kernel"
            tp4 += leaf.size + 4 * scales
    bf16 = plan(model, parse_mesh("dp=1,sp=1,tp=4"), **kwargs).stages["denoise"].weights
    int8 = plan(model, parse_mesh("dp=1,sp=1,tp=4"), weights_dtype="int8", **kwargs).stages["denoise"].weights
    # the kernels' bf16 bytes per device: split 4 ways but proj_out, whole
    kept = sum(
        nbytes(leaf) // (1 if name == "proj_out/kernel" else 4)
        for name, leaf in abstract
        if name in quantized
    )
    assert int8 == bf16 - kept + tp4


def stacked_and_fixed(spec) -> tuple[int, int]:
    """bf16 bytes of a component's streamable leaves (the stacked matmul kernels: ``blocks/.../kernel``,
    ``layers/.../kernel``) and of the others (stacked norms and biases included)."""
    sizes = {"stacked": 0, "fixed": 0}
    for name, leaf in leaves_with_paths(abstract_params(spec, "bfloat16")):
        parts = name.split("/")
        sizes["stacked" if parts[0] in ("blocks", "layers") and parts[-1] == "kernel" else "fixed"] += nbytes(
            leaf
        )
    return sizes["stacked"], sizes["fixed"]


def test_offload_modes_move_the_peak():
    """none: all weights plus the largest activations; model: the largest stage's own weights and
    activations, the text encoder's non-stacked leaves and 2 of its layers on the device (its layers
    streamed); blocks: the same for the DiT."""
    model = model_configs("14B")
    kwargs = dict(**P480, device_memory=24 * GiB)
    mesh = parse_mesh(ONE)
    for weights in ("bf16", "fp8"):
        none, by_model, blocks = (
            plan(model, mesh, offload=o, weights_dtype=weights, **kwargs) for o in OFFLOAD
        )
        stored = {name: s.weights for name, s in none.stages.items()}
        assert stored == {name: s.stored for name, s in none.stages.items()}
        assert none.peak == sum(stored.values()) + max(s.activations for s in none.stages.values())
        assert none.host == 0
        assert by_model.peak == max(s.weights + s.activations for s in by_model.stages.values())
        assert {name: s.stored for name, s in by_model.stages.items()} == stored
        assert by_model.stages["denoise"].weights == stored["denoise"]
        assert by_model.stages["decode"].weights == stored["decode"]
        encode = by_model.stages["encode"]
        assert encode.weights + encode.streamed - stored["encode"] == encode.streamed * 2 // 24  # 2 layers
        assert by_model.host == max(
            sum(stored.values()) - stored["encode"] + encode.streamed,
            stored["encode"] + stored["decode"],
            stored["encode"] + stored["denoise"],
        )
        # blocks: the same encode and decode, the DiT's layers streamed
        assert blocks.stages["encode"] == by_model.stages["encode"]
        assert blocks.stages["decode"] == by_model.stages["decode"]
        assert blocks.peak == max(s.weights + s.activations for s in blocks.stages.values())
        assert blocks.peak < by_model.peak < none.peak

    stacked, fixed = stacked_and_fixed(dit.checkpoint_spec(model.transformer))
    e_stacked, e_fixed = stacked_and_fixed(umt5.checkpoint_spec(model.text_encoder))
    blocks = plan(model, mesh, offload="blocks", **kwargs)
    denoise, encode = blocks.stages["denoise"], blocks.stages["encode"]
    assert denoise.weights == fixed + stacked * 2 // 40
    assert denoise.stored == fixed + stacked and denoise.streamed == stacked
    assert encode.weights == e_fixed + e_stacked * 2 // 24
    assert encode.stored == e_fixed + e_stacked and encode.streamed == e_stacked
    encoder, vae = encode.stored, blocks.stages["decode"].weights
    assert blocks.host == max(
        e_stacked + vae + fixed + stacked, encoder + vae + stacked, fixed + stacked + encoder
    )


OFFLOAD = ("none", "model", "blocks")


def test_flag_choices_are_the_librarys():
    from wanjax.cli.main import build_parser, subcommands
    from wanjax.io.quantizable import WEIGHTS_DTYPES
    from wanjax.models.offload import OFFLOAD_MODES

    assert OFFLOAD_MODES == OFFLOAD
    parser = build_parser(subcommands())
    for command in ("plan", "generate", "encode", "denoise"):
        args = parser.parse_args(
            [command, "--prompt", "a"] if command in ("generate", "encode") else [command]
        )
        assert (args.offload, args.weights_dtype) == ("none", "bf16"), command  # the schema's defaults
        choices = {a.dest: a.choices for a in parser._subcommands.choices[command]._actions}
        assert (
            tuple(choices["offload"]) == OFFLOAD_MODES and tuple(choices["weights_dtype"]) == WEIGHTS_DTYPES
        )


TARGET_14B = ["plan", "--model", "14B", "--height", "480", "--width", "832", "--frames", "81"]


def test_14b_at_480p_fits_one_24gib_device_with_streamed_fp8_blocks(capsys):
    """The issue's target: 14B at 832x480x81 on one 24 GiB device with --offload blocks --weights_dtype
    fp8 (the DiT step's activations, ~12 GiB, dominate; 2 fp8 layers and the non-stacked leaves add
    ~1 GiB); resident it needs ~49 GiB, and even fp8 with whole components swapped ~26 GiB."""
    args = [*TARGET_14B, "--num_devices", "1", "--device_memory", "24GiB"]
    assert main([*args, "--offload", "blocks", "--weights_dtype", "fp8"]) == 0
    out = capsys.readouterr().out
    assert "1 device, --offload blocks --weights_dtype fp8" in out
    peak = re.search(
        r"peak +([\d.]+) GiB per device of 24 GiB \(90% usable\), ([\d.]+) GiB of host memory.*: fits", out
    )
    assert peak and float(peak.group(1)) < 0.9 * 24, out
    assert re.search(r"blocks +[\d.]+ fits +[\d.]+ fits <-", out), out  # the mode table marks the chosen one
    assert main([*args, "--offload", "model", "--weights_dtype", "fp8"]) == 1
    out = capsys.readouterr().out
    assert "hint: the cheapest mode that fits: --offload blocks --weights_dtype bf16" in out


def test_13b_at_480p_fits_8gib_with_model_offload(capsys):
    """The issue's second target: 1.3B at 480p on 8 GiB with --offload model. UMT5-XXL's weights
    (5.7 B parameters, 10.6 GiB) exceed the device whole; streamed, the encode stage holds its 2 GiB
    embedding and 2 of its 24 layers. The largest stage is then the DiT's (2.6 GiB of weights and
    its activations), within the 7.2 GiB usable."""
    args = ["plan", "--model", "1.3B", "--height", "480", "--width", "832", "--device_memory", "8GiB"]
    args += ["--num_devices", "1", "--offload", "model"]
    model = model_configs("1.3B")
    by_model = plan(model, parse_mesh(ONE), **P480, device_memory=8 * GiB, offload="model")
    encode = by_model.stages["encode"]
    assert encode.stored > 10 * GiB and encode.weights < 3 * GiB and by_model.fits
    assert by_model.peak == by_model.on_device("denoise")
    resident = plan(model, parse_mesh(ONE), **P480, device_memory=8 * GiB)
    assert not resident.fits
    assert main(args) == 0
    out = capsys.readouterr().out
    assert re.search(r"model +[\d.]+ fits <-", out), out


def test_bad_offload_and_weights_dtype_are_one_line_errors(capsys):
    assert main([*ARGS, "--num_devices", "8", "--offload", "disk"]) == 2
    assert main([*ARGS, "--num_devices", "8", "--weights_dtype", "int4"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 2, err
    assert "--offload: invalid choice 'disk' (choose from none, model, blocks)" in err
    assert "invalid choice 'int4' (choose from bf16, int8, fp8, gguf)" in err


def test_image_to_video_14b_adds_clip_the_vae_and_the_image_layers(capsys):
    """I2V-14B against the reference models built on torch's meta device: our weights hold their
    parameters (CLIP ViT-H/14 without the pooled output's norm; the transformer without the unused
    ``norm_added_q``), and the plan's encode stage adds CLIP (float32) and the VAE (float32, loaded
    there and resident after), its denoise stage the I2V transformer's extra weights and the VAE."""
    import torch
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from transformers import CLIPVisionConfig as ReferenceCLIPConfig
    from transformers import CLIPVisionModel

    from wanjax.models import clip_vision
    from wanjax.models.vae import checkpoint_spec as vae_spec

    clip_cfg = CLIP_VIT_H_14
    fields = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "image_size")
    with torch.device("meta"):
        clip = CLIPVisionModel(
            ReferenceCLIPConfig(**{f: getattr(clip_cfg, f) for f in fields}, patch_size=14)
        )
        i2v = WanTransformer3DModel(**transformer_preset("I2V-14B").to_dict())
        t2v = WanTransformer3DModel(**transformer_preset("14B").to_dict())
        vae = AutoencoderKLWan()

    def count(module, skip: str = "^$") -> int:
        return sum(p.numel() for n, p in module.named_parameters() if not re.search(skip, n))

    def ours(spec, dtype="float32") -> tuple[int, int]:
        leaves = jax.tree.leaves(abstract_params(spec, dtype))
        return sum(a.size for a in leaves), sum(a.size * a.dtype.itemsize for a in leaves)

    clip_params, clip_bytes = ours(clip_vision.checkpoint_spec(clip_cfg))
    assert clip_params == count(clip, r"post_layernorm")
    vae_params, vae_bytes = ours(vae_spec(model_configs("I2V-14B").vae))
    assert vae_params == count(vae)
    i2v_params, i2v_bytes = ours(dit.checkpoint_spec(transformer_preset("I2V-14B")), "bfloat16")
    t2v_params, t2v_bytes = ours(dit.checkpoint_spec(transformer_preset("14B")), "bfloat16")
    assert i2v_params == count(i2v, r"norm_added_q") and t2v_params == count(t2v)

    kwargs = dict(height=480, width=832, frames=81, device_memory=80 * GiB)
    one = parse_mesh("dp=1,sp=1,tp=1")
    base, image = plan(model_configs("14B"), one, **kwargs), plan(model_configs("I2V-14B"), one, **kwargs)
    assert image.stages["encode"].weights - base.stages["encode"].weights == clip_bytes + vae_bytes
    assert (
        image.stages["denoise"].weights - base.stages["denoise"].weights == i2v_bytes - t2v_bytes + vae_bytes
    )
    assert image.stages["encode"].activations > base.stages["encode"].activations  # the VAE encode
    # every component once in the run's weights (the VAE sits in all three stages: counted once)
    _, decoder_bytes = ours(vae_spec(model_configs("I2V-14B").vae, "decoder"))
    assert image.weights - base.weights == clip_bytes + vae_bytes - decoder_bytes + i2v_bytes - t2v_bytes
    assert image.peak == max(image.weights + s.activations for s in image.stages.values())
    assert (
        main(["plan", "--model", "I2V-14B", "--num_devices", "8", "--height", "720", "--width", "1280"]) == 0
    )
    assert "I2V-14B: 1280x720" in capsys.readouterr().out


def test_two_experts_are_both_resident_or_take_turns(tmp_path):
    """A14B: two 14B transformers; resident together under ``--offload none``, one on the device at a
    time under ``model`` (the idle one in host memory). A directory is two-expert by its
    ``model_index.json``'s ``boundary_ratio``."""
    import json

    kwargs = dict(height=720, width=1280, frames=81, device_memory=80 * GiB)
    mesh = parse_mesh("dp=2,sp=1,tp=4")
    one = plan(model_configs("14B"), mesh, **kwargs).stages["denoise"]
    both = plan(model_configs("A14B"), mesh, **kwargs).stages["denoise"]
    assert both.weights == 2 * one.weights and both.activations == one.activations
    turns = plan(model_configs("A14B"), mesh, offload="model", **kwargs)
    assert turns.stages["denoise"].weights == one.weights and turns.stages["denoise"].streamed == one.weights
    assert "the idle expert" in turns.table()
    root = tmp_path / "a14b"
    (root / "transformer").mkdir(parents=True)
    (root / "transformer" / "config.json").write_text(json.dumps(transformer_preset("A14B").to_dict()))
    index = {"_class_name": "WanPipeline", "transformer": ["diffusers", "WanTransformer3DModel"]}
    second = {"transformer_2": ["diffusers", "WanTransformer3DModel"], "boundary_ratio": 0.875}
    (root / "model_index.json").write_text(json.dumps({**index, **second}))
    assert model_configs(str(root)).experts == 2
    (root / "model_index.json").write_text(json.dumps(index))
    assert model_configs(str(root)).experts == 1
    i2v = model_configs("I2V-A14B")  # no CLIP: the VAE alone joins the encode stage
    assert i2v.image and i2v.image_encoder is None and i2v.experts == 2


def test_a_vace_model_adds_its_control_blocks_weights_and_hints():
    """VACE-14B over 14B at 720p on tp=8: the control blocks' weights (never streamed: on the device
    with every offload mode) and the eight hints the blocks keep, each a residual stream's size (and
    resident, the control blocks' share of the text K/V cache)."""
    import jax.numpy as jnp

    from wanjax.io.checkpoint import LeafSource
    from wanjax.planning.weights import VACE_LEAVES, weight_bytes

    mesh, video = (
        parse_mesh("dp=1,sp=1,tp=8"),
        dict(height=720, width=1280, frames=81, device_memory=32 * GiB),
    )
    plain, vace = (plan(model_configs(name), mesh, **video).stages["denoise"] for name in ("14B", "VACE-14B"))
    cfg = model_configs("VACE-14B").transformer
    control = {k: v for k, v in dit.checkpoint_spec(cfg).items() if k in VACE_LEAVES}
    assert all(
        isinstance(x, LeafSource)
        for x in jax.tree.leaves(control, is_leaf=lambda x: isinstance(x, LeafSource))
    )
    assert vace.weights - plain.weights == weight_bytes(control, jnp.bfloat16, mesh.sizes).total > 0
    tokens = 2 * 21 * 45 * 80  # two CFG rows of 21 x 45 x 80 tokens, not split over tp
    text_kv = 2 * 8 * 2 * 512 * cfg.inner_dim * 2 // 8  # the control blocks' text K/V, heads over tp
    assert vace.activations - plain.activations == 8 * tokens * cfg.inner_dim * 2 + text_kv
    for offload in ("model", "blocks"):
        streamed = plan(model_configs("VACE-14B"), mesh, offload=offload, **video).stages["denoise"]
        plain_streamed = plan(model_configs("14B"), mesh, offload=offload, **video).stages["denoise"]
        assert streamed.weights - plain_streamed.weights == vace.weights - plain.weights


def test_an_animate_run_is_planned_by_one_segment_and_its_reference_frame(capsys):
    """Animate-14B makes its video 77 frames at a time (its default ``segment_frame_length``), each
    step over a latent frame more (the reference's): 20 + 1 latent frames, whatever ``--frames``; the
    step holds the face video's pixels besides what an image-to-video 14B step of 21 latent frames
    holds, the same blocks over the same tokens."""
    from wanjax.models.animate import abstract_control

    mesh = parse_mesh("dp=2,sp=1,tp=4")
    video = dict(height=720, width=1280, device_memory=32 * GiB)
    animate = model_configs("Animate-14B")
    plans = [plan(animate, mesh, frames=frames, **video) for frames in (17, 77, 161)]
    assert [p.latent_frames for p in plans] == [21, 21, 21]
    for p in plans[1:]:
        assert {n: s.activations for n, s in p.stages.items()} == {
            n: s.activations for n, s in plans[0].stages.items()
        }
    i2v = plan(model_configs("I2V-14B"), mesh, frames=81, **video)  # 21 latent frames
    assert i2v.latent_frames == 21 and i2v.layout == plans[0].layout
    face = abstract_control(animate.transformer, 77, (20, 90, 160)).face_pixels  # the step's input
    extra = plans[0].stages["denoise"].activations - i2v.stages["denoise"].activations
    assert extra == face.size * face.dtype.itemsize
    # a segment length given: rounded down to 4n + 1 as the pipeline does (46 -> 45: 12 + 1 frames)
    assert plan(animate, mesh, frames=161, segment_frame_length=46, **video).latent_frames == 13
    assert main(["plan", "--model", "Animate-14B", "--mesh", "dp=2,sp=1,tp=4", "--frames", "300"]) == 0
    assert "Animate-14B: 1280x720, segments of 77 frames," in capsys.readouterr().out
    flags = ["plan", "--model", "Animate-14B", "--mesh", "dp=2,sp=1,tp=4", "--segment_frame_length", "46"]
    assert main(flags) == 0
    out = capsys.readouterr().out
    shorter = plan(animate, mesh, frames=81, segment_frame_length=45, **video).on_device("denoise")
    assert "segments of 45 frames," in out and f"on device {shorter / GiB:7.2f} GiB" in out
    assert main(["plan", "--model", "14B", "--segment_frame_length", "45"]) == 2
    assert "--segment_frame_length is for an Animate model; 14B is not one" in capsys.readouterr().err


def test_the_compiled_animate_step_is_one_segment():
    """``plan --compile``'s programs make one segment: ``--segment_frame_length`` (rounded to 4n+1),
    else the variant's, whatever the video's frames."""
    from wanjax.models.registry import registry
    from wanjax.tools.compile_target import RunSpec

    run = RunSpec(registry()["Animate-14B"], 720, 1280, 300, parse_mesh("dp=2,sp=1,tp=4"))
    assert run.step_frames == 77 and run.latents_shape[2] == 20
    run = dataclasses.replace(run, segment_frame_length=46)
    assert run.step_frames == 45 and run.latents_shape[2] == 12
