"""The CLIP vision encoder loaded through wanjax equals transformers' CLIPVisionModel (the
``hidden_states[-2]`` Wan's image-to-video pipeline conditions on), and the image preprocessing equals
transformers' CLIPImageProcessor (PIL backend), on tiny random models and synthetic images."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from helpers.compare import relative_error
from helpers.models import randomize_
from PIL import Image
from safetensors.numpy import load_file, save_file
from transformers import CLIPVisionConfig as HFConfig
from transformers import CLIPVisionModel
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

from wanjax.errors import CheckpointError, ConfigError, WanjaxError
from wanjax.models.clip_vision import (
    IMAGE_ENCODER,
    CLIPVisionConfig,
    forward,
    load_image_encoder,
    penultimate_hidden_states,
)
from wanjax.models.image_processor import (
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    ImageProcessor,
    ImageProcessorConfig,
    load_image,
    load_image_processor,
)

# Wan 2.1 image-to-video's image encoder, shrunk: ViT "/14" at 224 px (257 tokens), exact GELU.
GELU = dict(
    hidden_size=32,
    intermediate_size=37,
    num_hidden_layers=3,
    num_attention_heads=4,
    patch_size=14,
    image_size=224,
    hidden_act="gelu",
)
# quick_gelu, and an image size the patch does not divide (the convolution drops the remainder).
QUICK = dict(
    hidden_size=24,
    intermediate_size=40,
    num_hidden_layers=2,
    num_attention_heads=3,
    patch_size=14,
    image_size=30,
    hidden_act="quick_gelu",
    layer_norm_eps=1e-6,
)
# Wan's image_processor/preprocessor_config.json
WAN_PROCESSOR = dict(do_resize=True, size={"shortest_edge": 224}, resample=3, do_center_crop=True,
                     crop_size={"height": 224, "width": 224}, do_rescale=True, rescale_factor=1 / 255,
                     do_normalize=True, image_mean=OPENAI_CLIP_MEAN, image_std=OPENAI_CLIP_STD,
                     do_convert_rgb=True)  # fmt: skip


def save_image_encoder(root, seed: int = 0, **config) -> CLIPVisionModel:
    model = randomize_(CLIPVisionModel(HFConfig(**config)), seed).eval()
    model.save_pretrained(root / "image_encoder")
    return model


def reference_hidden_states(model: CLIPVisionModel, pixels: np.ndarray) -> list[np.ndarray]:
    with torch.no_grad():
        out = model(pixel_values=torch.from_numpy(pixels), output_hidden_states=True)
    return [h.float().numpy() for h in out.hidden_states]


def pixel_batch(size: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((2, 3, size, size), dtype=np.float32)


@pytest.fixture(scope="module", params=[GELU, QUICK], ids=["gelu", "quick_gelu"])
def case(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param["hidden_act"])
    model = save_image_encoder(root, seed=1, **request.param)
    pixels = pixel_batch(request.param["image_size"], seed=2)
    return root, model, pixels, reference_hidden_states(model, pixels)


def test_float32_hidden_states_match_transformers(case):
    """Every hidden state (embeddings after pre_layrnorm, then each layer) within 1e-5; encode is
    hidden_states[-2]."""
    root, _, pixels, ref = case
    encoder = load_image_encoder(root, dtype="float32")
    assert encoder.processor is None
    assert len(ref) == encoder.cfg.num_hidden_layers + 1
    for layers, expected in enumerate(ref):
        out = forward(encoder.params, encoder.cfg, pixels, layers=layers)
        assert out.shape == expected.shape
        assert relative_error(out, expected) <= 1e-5, layers
    out = np.asarray(encoder.encode(pixels))
    assert out.dtype == np.float32
    assert relative_error(out, ref[-2]) <= 1e-5
    eager = penultimate_hidden_states(encoder.params, encoder.cfg, pixels)  # unfused: other roundings
    assert relative_error(out, eager) <= 1e-6


def test_bfloat16_close_to_transformers(case):
    """bf16 keeps 8 significant bits (relative rounding <= 2^-9 per operation): a transformers model
    run in bf16 is itself ~0.5% off its float32 output here. Ours must be as close to float32 as
    that (within 2x) and to the bf16 reference."""
    root, model, pixels, ref = case
    encoder = load_image_encoder(root / "image_encoder")
    assert encoder.dtype == np.dtype("bfloat16")
    out = encoder.encode(pixels)
    assert out.dtype == np.dtype("bfloat16")
    reference_bf16 = reference_hidden_states(copy.deepcopy(model).to(torch.bfloat16), pixels)[-2]
    torch_error = relative_error(reference_bf16, ref[-2])
    assert relative_error(out.astype(np.float32), ref[-2]) <= max(2 * torch_error, 2e-3)
    assert relative_error(out.astype(np.float32), reference_bf16) <= 2e-2


def test_transformers4_checkpoint_names(tmp_path, case):
    """Wan's checkpoint was written by transformers 4: every name under ``vision_model.``, and an old
    ``position_ids`` buffer. Both spellings load to the same encoder (transformers 5 reads it too)."""
    root, _, pixels, ref = case
    tensors = load_file(root / "image_encoder" / "model.safetensors")
    folder = tmp_path / "image_encoder"
    folder.mkdir()
    (folder / "config.json").write_text((root / "image_encoder" / "config.json").read_text())
    renamed = {f"vision_model.{name}": value for name, value in tensors.items()}
    renamed["vision_model.embeddings.position_ids"] = np.arange(ref[0].shape[1])[None]
    save_file(renamed, folder / "model.safetensors")
    with torch.no_grad():
        reloaded = CLIPVisionModel.from_pretrained(folder).eval()
    assert relative_error(reference_hidden_states(reloaded, pixels)[-2], ref[-2]) == 0
    assert IMAGE_ENCODER.check(tmp_path).hidden_act == case[1].config.hidden_act
    assert relative_error(load_image_encoder(tmp_path, dtype="float32").encode(pixels), ref[-2]) <= 1e-5

    del renamed["vision_model.encoder.layers.0.mlp.fc1.bias"]
    save_file(renamed, folder / "model.safetensors")
    with pytest.raises(
        CheckpointError, match=r"missing tensors: vision_model\.encoder\.layers\.0\.mlp\.fc1\.bias"
    ):
        load_image_encoder(tmp_path)


def test_config_errors(tmp_path):
    base = HFConfig(**GELU).to_dict()
    for change, message in [
        ({"hidden_act": "relu"}, "hidden_act 'relu' is not supported"),
        ({"num_attention_heads": 5}, "not a multiple of num_attention_heads"),
        ({"use_rotary": True}, "unknown field"),
        ({"model_type": "siglip_vision_model"}, "model_type"),
    ]:
        (tmp_path / "config.json").write_text(json.dumps({**base, **change}))
        with pytest.raises(ConfigError, match=message):
            CLIPVisionConfig.from_file(tmp_path / "config.json")
    (tmp_path / "config.json").write_text(json.dumps(base))
    assert CLIPVisionConfig.from_file(tmp_path / "config.json").num_positions == 257


def test_wrong_pixel_shape(case):
    root, _, pixels, _ = case
    encoder = load_image_encoder(root)
    with pytest.raises(WanjaxError, match="pixel values of shape"):
        encoder.encode(pixels[:, :, :-1])
    with pytest.raises(WanjaxError, match="no image processor"):
        encoder.encode_images(Image.new("RGB", (40, 30)))


# ----------------------------------------------------------------------------------------------
# Preprocessing


def noise(height: int, width: int, channels: int, seed: int) -> np.ndarray:
    """Random pixels with some structure (a gradient) and full-range noise."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 255, width)[None, :, None] * np.linspace(0.2, 1, height)[:, None, None]
    values = 0.5 * ramp + 0.5 * rng.integers(0, 256, (height, width, channels))
    return values.astype(np.uint8)


def sample_images() -> list[Image.Image]:
    """Odd sizes, portrait and landscape, up- and downscaled, and every mode convert_rgb handles."""
    palette = Image.fromarray(noise(300, 260, 3, 5)).quantize(64)
    transparent = palette.copy()
    transparent.info["transparency"] = 3
    return [
        Image.fromarray(noise(211, 317, 3, 0)),  # landscape
        Image.fromarray(noise(400, 150, 3, 1)),  # portrait
        Image.fromarray(noise(224, 224, 3, 2)),  # already the crop size
        Image.fromarray(noise(80, 100, 3, 3)),  # upscaled
        Image.fromarray(noise(260, 300, 4, 4), "RGBA"),
        Image.fromarray(noise(333, 500, 1, 6)[..., 0], "L"),
        Image.fromarray(noise(201, 199, 2, 7), "LA"),
        palette,
        transparent,
    ]


def reference_pixels(images, **config) -> np.ndarray:
    processor = CLIPImageProcessorPil(**config)
    return np.stack([processor(images=image, return_tensors="np")["pixel_values"][0] for image in images])


def test_preprocessing_matches_transformers_wan_config():
    images = sample_images()
    ours = ImageProcessor()(images)
    assert ours.shape == (len(images), 3, 224, 224) and ours.dtype == np.float32
    np.testing.assert_array_equal(ours, reference_pixels(images, **WAN_PROCESSOR))


def test_preprocessing_arrays_match_transformers():
    """uint8 arrays take transformers' NumPy path: grey repeated, RGBA blended onto white in float64."""
    arrays = [noise(211, 317, 3, 8), noise(290, 230, 4, 9), noise(150, 170, 1, 10)]
    expected = reference_pixels(arrays, **WAN_PROCESSOR)
    np.testing.assert_array_equal(ImageProcessor()(arrays), expected)
    np.testing.assert_array_equal(ImageProcessor()(arrays[1]), expected[1:2])
    rgb = noise(240, 250, 3, 11)
    np.testing.assert_array_equal(ImageProcessor()(rgb), ImageProcessor()(Image.fromarray(rgb)))


@pytest.mark.parametrize(
    "config",
    [
        dict(size={"height": 97, "width": 131}, crop_size={"height": 64, "width": 90}, resample=2),
        dict(size={"shortest_edge": 20}, crop_size={"height": 32, "width": 25}, do_normalize=False),
        dict(size={"shortest_edge": 61}, crop_size={"height": 61, "width": 61}, resample=1,
             image_mean=0.5, image_std=0.25),
    ],
    ids=["exact_bilinear", "crop_padding", "lanczos_scalar_norm"],
)  # fmt: skip
def test_preprocessing_options_match_transformers(tmp_path, config):
    """Options round-trip through preprocessor_config.json as transformers writes it."""
    images = sample_images()[:6]
    CLIPImageProcessorPil(**config).save_pretrained(tmp_path / "image_processor")
    ours = load_image_processor(tmp_path)(images)
    np.testing.assert_array_equal(ours, reference_pixels(images, **config))


def test_encode_images_matches_pipeline(tmp_path):
    """``encode_images`` = WanImageToVideoPipeline.encode_image: processor, encoder, hidden_states[-2]."""
    model = save_image_encoder(tmp_path, seed=3, **GELU)
    CLIPImageProcessorPil(**WAN_PROCESSOR).save_pretrained(tmp_path / "image_processor")
    assert load_image_processor(tmp_path).cfg == ImageProcessorConfig.from_dict(
        json.loads((tmp_path / "image_processor" / "preprocessor_config.json").read_text())
    )
    images = sample_images()[:3]
    encoder = load_image_encoder(tmp_path, dtype="float32")
    ref = reference_hidden_states(model, reference_pixels(images, **WAN_PROCESSOR))[-2]
    assert relative_error(encoder.encode_images(images), ref) <= 1e-5


def test_load_image_matches_diffusers(tmp_path):
    from diffusers.utils import load_image as diffusers_load_image

    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90°
    path = tmp_path / "rgba.png"
    Image.fromarray(noise(120, 90, 4, 12), "RGBA").save(path, exif=exif)
    ours = load_image(path)
    assert ours.size == (120, 90)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(diffusers_load_image(str(path))))
    np.testing.assert_array_equal(ImageProcessor()(path), ImageProcessor()(ours))


def test_preprocessing_errors(tmp_path):
    processor = ImageProcessor()
    (tmp_path / "junk.png").write_bytes(b"not an image")
    cases = [
        (Image.new("RGB", (0, 10)), "empty image"),
        (np.zeros((0, 5, 3), np.uint8), "empty image"),
        (np.zeros((10, 10, 3), np.float32), "must be uint8"),
        (np.zeros((10, 10, 2), np.uint8), "must be uint8"),
        (tmp_path / "missing.png", "no such image file"),
        (tmp_path / "junk.png", "cannot read image"),
        ([], "no images"),
        (3, "not an image"),
    ]
    for image, message in cases:
        with pytest.raises(WanjaxError, match=message) as raised:
            processor(image)
        assert "\n" not in str(raised.value)
    unconverted = ImageProcessor(ImageProcessorConfig(do_convert_rgb=False))
    with pytest.raises(WanjaxError, match="not 8-bit RGB"):
        unconverted(Image.new("L", (30, 30)))
    uncropped = ImageProcessor(ImageProcessorConfig(do_center_crop=False))
    with pytest.raises(WanjaxError, match="differ in shape"):
        uncropped([Image.new("RGB", (300, 224)), Image.new("RGB", (224, 300))])
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"size": {"longest_edge": 5}}))
    with pytest.raises(ConfigError, match=r"size .* is not supported"):
        load_image_processor(tmp_path)
