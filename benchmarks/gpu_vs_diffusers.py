"""Issue 19's GPU table in one command: wanjax against diffusers, transformers and torch on one machine.

Parts (``--parts``, default all), each measurement in a process of its own (an out-of-memory error
costs that line only, and every memory peak is that process's own):

* ``matmul``: a bf16 n^3 matmul (n = 8192), torch and JAX: the machine's attainable rate.
* ``dit``: the DiT with 1.3B dimensions (30 layers) forward, bf16, batch 1 and 2, at 480x832x81
  (latents [B,16,21,60,104], 32,760 tokens) with 512 text tokens: diffusers eager, diffusers with
  ``compile_repeated_blocks(fullgraph=True)`` (CUDA only), wanjax; wanjax again with
  ``attention_backend="xla"`` (batch 1), and with its GEMMs returning bf16 (``wanjax bf16 gemm``,
  batch 1: an experiment, see :func:`gemm_in_activation_dtype`).
* ``sampler``: wanjax's sampler step with CFG (UniPC, the pair batched: batch 2) on those weights;
  the step program's compile time and memory.
* ``dit14b``: 14B dimensions, 4 layers, at 1280x720x81 (latents [1,16,21,90,160], 75,600 tokens).
* ``vae``: the Wan 2.1 VAE decode of latents [1,16,21,60,104] (81 frames, 480x832), float32 and
  bfloat16: diffusers, wanjax (``--vae_precision`` sets wanjax's float32 conv precision), and
  wanjax variants (``--vae-sides``, default all; see ``VAE_VARIANTS``): on CUDA the convolution
  layouts XLA's heuristic picks (``wanjax nchw``: the VAE's ``xla_gpu_force_conv_nhwc`` outvoted by
  ``XLA_FLAGS=--xla_gpu_force_conv_nchw=true``), the compile split over the CPU's threads
  (``wanjax llvm parallel``) and without autotuning (``wanjax autotune 0``: how much of the compile
  it is); everywhere the 3-D convolutions over a concatenated window and a shifted two-frame
  cache instead of the ring written in place (``wanjax concat cache``), 4 video frames per step
  (``wanjax 4 frames/step``) and the CPU's formulation (``wanjax taps``: 2-D convolutions per
  temporal tap, owed-sum caches; less program memory).
* ``umt5``: the UMT5-XXL encoder (24 layers; the vocabulary cut to 32,128 rows, a gather whose cost
  does not depend on it), 2 x 512 tokens, float32 and bfloat16: transformers, wanjax.
* ``attention``: attention cores, bf16, at L = 32,768 with 12 heads of 128 and L = 75,600 with 40
  heads: torch SDPA with the cuDNN and the FLASH backend; wanjax ``attention(backend="cudnn")`` and
  ``jax.nn.dot_product_attention(implementation="cudnn")`` (CUDA only; off CUDA the portable paths:
  torch's default SDPA and wanjax's ``xla`` backend).

Both sides load the same random weights, saved once with ``save_pretrained`` into ``--workdir``
(kept there for the next run; DiT and UMT5 in bf16, the VAE in float32; UMT5 drawn with std 0.005,
as larger weights make T5's attention chaotic over 24 layers, the rest by wanjax's rule of
``wanjax.io.checkpoint.random_scale``), and the same inputs. Each measurement: a warm-up call, then
the median of ``--repeats`` (3) calls; the memory peak of its process (torch:
``torch.cuda.max_memory_allocated()``; JAX: the allocator's ``peak_bytes_in_use``, with
``XLA_PYTHON_CLIENT_PREALLOCATE=false``; wanjax also gives its program's own ``memory_analysis()``;
peak RSS on a CPU). The outputs of the sides are compared (relative error ``‖a - b‖ / ‖b‖``).
Every record is a JSON line in ``--out`` (appended) and a line of text on stdout.

    python benchmarks/gpu_vs_diffusers.py --out gpu.jsonl                    # everything (CUDA)
    python benchmarks/gpu_vs_diffusers.py --parts dit sampler --out gpu.jsonl
    python benchmarks/gpu_vs_diffusers.py --small --out small.jsonl          # tiny sizes: a CPU smoke run

``--small`` shrinks every size (a CPU runs everything in a minute or two); parts that need CUDA
(diffusers' compiled blocks, the cuDNN and FLASH attention kernels) then say "skipped: no CUDA".
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import common
import numpy as np

PARTS = ("matmul", "dit", "sampler", "dit14b", "vae", "umt5", "attention")
WEIGHTS = {"dit": "dit", "sampler": "dit", "dit14b": "dit14b", "vae": "vae", "umt5": "umt5"}
UMT5_STD = 0.005


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Every size the parts use."""

    matmul_n: int
    dit: dict[str, Any]  # WanTransformer3DModel arguments
    dit_latent: tuple[int, int, int, int]  # (C, T, H, W) per sample
    dit14b: dict[str, Any]
    dit14b_latent: tuple[int, int, int, int]
    text_tokens: int
    sampler_steps: int  # the first is the warm-up
    vae: dict[str, Any]  # AutoencoderKLWan arguments
    vae_latent: tuple[int, int, int, int, int]
    umt5: dict[str, Any]  # UMT5Config arguments
    umt5_tokens: tuple[int, int]
    attention: tuple[tuple[int, int, int], ...]  # (L, heads, head dim)
    attention_check: int  # queries whose outputs are compared


FULL = Sizes(
    matmul_n=8192,
    dit=dict(num_attention_heads=12, attention_head_dim=128, ffn_dim=8960, num_layers=30),
    dit_latent=(16, 21, 60, 104),
    dit14b=dict(num_attention_heads=40, attention_head_dim=128, ffn_dim=13824, num_layers=4),
    dit14b_latent=(16, 21, 90, 160),
    text_tokens=512,
    sampler_steps=4,
    vae={},  # the real architecture
    vae_latent=(1, 16, 21, 60, 104),
    umt5=dict(vocab_size=32128, d_model=4096, d_kv=64, num_heads=64, d_ff=10240, num_layers=24),
    umt5_tokens=(2, 512),
    attention=((32768, 12, 128), (75600, 40, 128)),
    attention_check=2048,
)
_TINY_DIT = dict(text_dim=32, freq_dim=16, rope_max_seq_len=32)
SMALL = Sizes(
    matmul_n=256,
    dit=dict(num_attention_heads=2, attention_head_dim=16, ffn_dim=64, num_layers=2, **_TINY_DIT),
    dit_latent=(16, 2, 8, 8),
    dit14b=dict(num_attention_heads=4, attention_head_dim=16, ffn_dim=96, num_layers=2, **_TINY_DIT),
    dit14b_latent=(16, 2, 12, 16),
    text_tokens=16,
    sampler_steps=4,
    vae=dict(
        base_dim=8, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1, temperal_downsample=[False, True, True]
    ),
    vae_latent=(1, 16, 2, 4, 6),
    umt5=dict(vocab_size=256, d_model=64, d_kv=16, num_heads=4, d_ff=128, num_layers=2),
    umt5_tokens=(2, 16),
    attention=((256, 2, 64), (300, 4, 64)),
    attention_check=128,
)


# ----------------------------------------------------------------------------------------------
# What runs where: (case, side) per part, which need CUDA, and which outputs are compared


def plan(part: str, sizes: Sizes) -> list[tuple[str, str]]:
    """The (case, side) measurements of ``part``, in the order they run."""
    if part == "matmul":
        return [("bf16", "torch"), ("bf16", "jax")]
    if part == "dit":
        out = [(f"batch {b}", s) for b in (1, 2) for s in ("diffusers", "diffusers-compiled", "wanjax")]
        return [*out, ("batch 1", "wanjax bf16 gemm"), ("batch 1, attention xla", "wanjax")]
    if part == "sampler":
        return [("CFG step, batch 2", "wanjax")]
    if part == "dit14b":
        return [("batch 1", s) for s in ("diffusers", "diffusers-compiled", "wanjax")]
    if part == "vae":
        return [(d, s) for d in ("float32", "bfloat16") for s in ("diffusers", "wanjax", *VAE_VARIANTS)]
    if part == "umt5":
        return [(d, s) for d in ("float32", "bfloat16") for s in ("transformers", "wanjax")]
    if part == "attention":
        cases = [f"L={n} {h}x{d}" for n, h, d in sizes.attention]
        sides = (
            "torch cudnn",
            "torch flash",
            "torch default",
            "wanjax cudnn",
            "jax.nn cudnn",
            "jax mosaic_gpu",
            "wanjax xla",
        )
        return [(c, s) for c in cases for s in sides]
    raise ValueError(part)


@dataclasses.dataclass(frozen=True)
class VaeVariant:
    """A wanjax VAE decode beside the default one: ``load_vae`` arguments, ``XLA_FLAGS`` of its
    process, and whether it means anything off CUDA."""

    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    xla_flags: str = ""
    cuda_only: bool = False


VAE_VARIANTS = {
    # XLA's layout assignment checks force_conv_nchw before force_conv_nhwc
    "wanjax nchw": VaeVariant(xla_flags="--xla_gpu_force_conv_nchw=true", cuda_only=True),
    "wanjax llvm parallel": VaeVariant(
        xla_flags="--xla_gpu_enable_llvm_module_compilation_parallelism=true", cuda_only=True
    ),
    "wanjax autotune 0": VaeVariant(xla_flags="--xla_gpu_autotune_level=0", cuda_only=True),
    "wanjax concat cache": VaeVariant({"conv": "conv3d"}),
    "wanjax 4 frames/step": VaeVariant({"frames_per_step": 4}),
    "wanjax taps": VaeVariant({"conv": "taps"}),
}


def skip_reason(part: str, side: str, cuda: bool, vae_sides: list[str] | None = None) -> str | None:
    if side in VAE_VARIANTS and vae_sides is not None and side not in vae_sides:
        return "not in --vae-sides"
    if side in VAE_VARIANTS and VAE_VARIANTS[side].cuda_only and not cuda:
        return "no CUDA (a GPU compiler setting)"
    if side == "diffusers-compiled" and not cuda:
        return "no CUDA (torch.compile of the blocks is measured on GPUs only)"
    if side in ("torch cudnn", "torch flash", "wanjax cudnn", "jax.nn cudnn", "jax mosaic_gpu") and not cuda:
        return "no CUDA"
    if side in ("torch default", "wanjax xla") and cuda:
        return "CUDA: the cuDNN/FLASH kernels are compared instead"
    return None


def comparisons(part: str, sizes: Sizes) -> list[tuple[tuple[str, str], tuple[str, str]]]:
    """((case, side), (reference case, reference side)) pairs whose outputs are compared."""
    if part in ("dit", "dit14b"):
        cases = [c for c, s in plan(part, sizes) if s == "diffusers"]
        out = [((c, s), (c, "diffusers")) for c in cases for s in ("diffusers-compiled", "wanjax")]
        if part == "dit":
            out.append((("batch 1", "wanjax bf16 gemm"), ("batch 1", "diffusers")))
            out.append((("batch 1, attention xla", "wanjax"), ("batch 1", "diffusers")))
        return out
    if part in ("vae", "umt5"):
        ref = "diffusers" if part == "vae" else "transformers"
        variants = [((d, s), (d, "wanjax")) for d in ("float32", "bfloat16") for s in VAE_VARIANTS]
        return [
            *(variants if part == "vae" else []),
            (("float32", "wanjax"), ("float32", ref)),
            (("bfloat16", "wanjax"), ("bfloat16", ref)),
            (("bfloat16", "wanjax"), ("float32", ref)),
            (("bfloat16", ref), ("float32", ref)),
        ]
    if part == "attention":
        out = []
        for n, h, d in sizes.attention:
            c = f"L={n} {h}x{d}"
            out += [
                ((c, s), (c, "torch cudnn"))
                for s in ("torch flash", "wanjax cudnn", "jax.nn cudnn", "jax mosaic_gpu")
            ]
            out.append(((c, "wanjax xla"), (c, "torch default")))
        return out
    return []


# ----------------------------------------------------------------------------------------------
# Children: each measures one (part, case, side) and emits its record


def output_path(work: Path, part: str, case: str, side: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", f"{part}-{case}-{side}").strip("-")
    return work / "outputs" / f"{slug}.npy"


class Child:
    """One measurement: its identity, sizes, folder and the record it builds."""

    def __init__(self, part: str, case: str, side: str, sizes: Sizes, work: Path, repeats: int, args: Any):
        self.part, self.case, self.side = part, case, side
        self.sizes, self.work, self.repeats, self.args = sizes, work, repeats, args
        self.record: dict[str, Any] = {"part": part, "case": case, "side": side}

    def save(self, out: np.ndarray) -> None:
        path = output_path(self.work, self.part, self.case, self.side)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, np.asarray(out, np.float32))

    def finish(self, stats: dict[str, Any], flops: float | Callable[[], float] | None = None) -> None:
        """Emit the record with ``stats``; ``flops`` may be a function, called only now (after the
        memory figures were read: on the torch side it imports wanjax, hence JAX)."""
        self.record.update(stats)
        if callable(flops):
            flops = flops()
        if flops:
            self.record["tflop"] = flops / 1e12
            self.record["tflops"] = flops / stats["median_s"] / 1e12
        common.emit(self.record)


def torch_env() -> tuple[Any, str]:
    import torch

    return torch, ("cuda" if torch.cuda.is_available() else "cpu")


def torch_sync(torch: Any) -> Callable[[Any], Any]:
    def sync(out: Any) -> Any:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return out

    return sync


def torch_memory(torch: Any) -> dict[str, Any]:
    cuda = torch.cuda.is_available()
    return {
        "peak_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "peak_source": "torch.cuda.max_memory_allocated" if cuda else "n/a (CPU)",
        "peak_rss_bytes": common.peak_rss_bytes(),
    }


def jax_memory(compiled: Any = None) -> dict[str, Any]:
    from wanjax.tools.measure import allocator_peak_bytes, program_memory

    peak = allocator_peak_bytes()
    out = {
        "peak_bytes": peak,
        "peak_source": "allocator peak_bytes_in_use" if peak is not None else "n/a (CPU)",
        "peak_rss_bytes": common.peak_rss_bytes(),
    }
    if compiled is not None:
        out["program_memory"] = program_memory(compiled)
    return out


def dit_inputs(c: Child, batch: int, latent: tuple[int, ...], text_dim: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(batch)
    latents = common.bf16_round(rng.standard_normal((batch, *latent), dtype=np.float32))
    text = common.bf16_round(rng.standard_normal((batch, c.sizes.text_tokens, text_dim), dtype=np.float32))
    return latents, np.full((batch,), 500, np.int64), text


def dit_flops(root: Path, shape: tuple[int, ...], text_tokens: int, guidance: bool = False) -> float:
    from wanjax.models.config import TransformerConfig
    from wanjax.tools.flops import dit_forward_flops, dit_step_flops

    cfg = TransformerConfig.from_file(root / "transformer" / "config.json")
    if guidance:
        return dit_step_flops(cfg, shape, text_tokens, guidance=True).total
    return dit_forward_flops(cfg, shape, text_tokens).total


def child_matmul(c: Child) -> None:
    n = c.sizes.matmul_n
    flops = 2 * n**3
    if c.side == "torch":
        torch, dev = torch_env()
        a = torch.randn(n, n, device=dev).to(torch.bfloat16)
        stats, _ = common.time_calls(lambda: a @ a, c.repeats, torch_sync(torch))
        c.record.update(torch_memory(torch), device=dev)
    else:
        import jax
        import jax.numpy as jnp

        a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
        f = jax.jit(lambda x: x @ x)
        stats, _ = common.time_calls(lambda: f(a), c.repeats, jax.block_until_ready)
        c.record.update(jax_memory(), device=jax.devices()[0].device_kind)
    c.finish(stats, flops)


def child_dit(c: Child) -> None:
    root = c.work / "weights" / WEIGHTS[c.part]
    latent = c.sizes.dit_latent if c.part == "dit" else c.sizes.dit14b_latent
    config = json.loads((root / "transformer" / "config.json").read_text())
    batch = int(c.case.split()[1].rstrip(","))
    latents, timestep, text = dit_inputs(c, batch, latent, config["text_dim"])
    if c.side.startswith("diffusers"):
        torch, dev = torch_env()
        from diffusers import WanTransformer3DModel

        model = WanTransformer3DModel.from_pretrained(root / "transformer", torch_dtype=torch.bfloat16)
        model = model.to(dev).eval()
        if c.side == "diffusers-compiled":
            model.compile_repeated_blocks(fullgraph=True)
        inputs = (
            torch.from_numpy(latents).to(dev, torch.bfloat16),
            torch.from_numpy(timestep).to(dev),
            torch.from_numpy(text).to(dev, torch.bfloat16),
        )
        with torch.inference_mode():
            stats, out = common.time_calls(
                lambda: model(*inputs, return_dict=False)[0], c.repeats, torch_sync(torch)
            )
        c.save(out.float().cpu().numpy())
        c.record.update(torch_memory(torch), device=dev)
    else:
        import jax
        import jax.numpy as jnp

        import wanjax
        from wanjax.models.dit import DitInputs

        backend = "xla" if "attention xla" in c.case else "auto"
        if c.side == "wanjax bf16 gemm":
            gemm_in_activation_dtype()
        model = wanjax.load_transformer(root, dtype="bfloat16", attention_backend=backend)
        inputs = DitInputs(jnp.asarray(latents), jnp.asarray(timestep, jnp.int32), jnp.asarray(text))
        args = (model.params, inputs)
        start = time.perf_counter()
        compiled = jax.jit(model.apply).lower(*args).compile()
        c.record["compile_s"] = time.perf_counter() - start
        stats, out = common.time_calls(lambda: compiled(*args), c.repeats, jax.block_until_ready)
        c.save(np.asarray(out.astype(jnp.float32)))
        c.record.update(jax_memory(compiled), device=jax.devices()[0].device_kind, attention_backend=backend)
    c.finish(stats, lambda: dit_flops(root, latents.shape, c.sizes.text_tokens))


def gemm_in_activation_dtype() -> None:
    """The experiment of the ``wanjax bf16 gemm`` side: every DiT linear's GEMM returns the activation
    dtype (cuBLAS still accumulates in float32) and the bias is added to that, where wanjax's GEMMs
    return float32, add the bias and round once, as torch's cuBLASLt bias epilogue does. XLA's GEMM
    rewriter does not fold a float32 -> bf16 convert into cuBLAS (only FP8 outputs), so wanjax writes
    and reads every GEMM output (7 of width 1,536 and one of 8,960 per block) in float32: ~2.6 GB per
    block at 32,760 tokens, ~23 ms of an H100's 3.35 TB/s per forward. This side measures what
    writing them in bf16 saves, and the error it adds (the bias after a rounding)."""
    import jax.numpy as jnp

    from wanjax.kernels.precision import lax_precision
    from wanjax.models import dit

    def linear(x, p, out_dtype=None, precision="highest"):
        a = x.astype(p["kernel"].dtype)
        y = jnp.matmul(
            a, p["kernel"], preferred_element_type=a.dtype, precision=lax_precision(precision, a.dtype)
        )
        if "bias" in p:
            y = y + p["bias"].astype(y.dtype)
        return y.astype(out_dtype or x.dtype)

    dit.linear = linear


def child_sampler(c: Child) -> None:
    import jax
    import jax.numpy as jnp

    import wanjax
    from wanjax.sampling.sampler import Sampler
    from wanjax.sampling.scheduler import SchedulerConfig, make_scheduler
    from wanjax.tools.measure import program_memory

    root = c.work / "weights" / "dit"
    model = wanjax.load_transformer(root, dtype="bfloat16")
    latents, _, text = dit_inputs(c, 1, c.sizes.dit_latent, model.cfg.text_dim)
    scheduler = make_scheduler(SchedulerConfig(), c.sizes.sampler_steps)
    sampler = Sampler(model)
    prompt = jnp.asarray(text, jnp.bfloat16)
    start = time.perf_counter()
    result = sampler(scheduler, jnp.asarray(latents), prompt, prompt, 5.0)
    jax.block_until_ready(result.latents)
    times = result.step_times
    total = time.perf_counter() - start
    steady = list(times.steady)
    stats = {
        "first_s": times.first,
        "times_s": steady,
        "median_s": float(np.median(steady)) if steady else times.first,
        "min_s": min(steady, default=times.first),
        "compile_s": times.compile,
        "loop_s": total,
        "steps": c.sizes.sampler_steps,
    }
    programs = sampler.programs()
    c.record.update(jax_memory(), device=jax.devices()[0].device_kind)
    c.record["program_memory"] = program_memory(programs[-1]) if programs else None
    c.finish(stats, dit_flops(root, latents.shape, c.sizes.text_tokens, guidance=True))


def child_vae(c: Child) -> None:
    root = c.work / "weights" / "vae"
    z = np.random.default_rng(4).standard_normal(c.sizes.vae_latent, dtype=np.float32)
    if c.case == "bfloat16":
        z = common.bf16_round(z)

    def flops() -> float:
        from wanjax.models.vae.config import VAEConfig
        from wanjax.tools.flops import vae_decode_flops

        return vae_decode_flops(VAEConfig.from_file(root / "vae" / "config.json"), z.shape).total

    if c.side == "diffusers":
        torch, dev = torch_env()
        from diffusers import AutoencoderKLWan

        dtype = getattr(torch, c.case)
        model = AutoencoderKLWan.from_pretrained(root / "vae", torch_dtype=dtype).to(dev).eval()
        zt = torch.from_numpy(z).to(dev, dtype)
        with torch.inference_mode():
            stats, out = common.time_calls(lambda: model.decode(zt).sample, c.repeats, torch_sync(torch))
        c.save(out.float().cpu().numpy())
        c.record.update(torch_memory(torch), device=dev)
    else:
        import jax
        import jax.numpy as jnp

        import wanjax

        kwargs = {"precision": c.args.vae_precision} if c.args.vae_precision else {}
        kwargs.update(VAE_VARIANTS[c.side].kwargs if c.side in VAE_VARIANTS else {})
        vae = wanjax.load_vae(root, dtype=c.case, **kwargs)
        zj = jnp.asarray(z)
        start = time.perf_counter()
        compiled = vae.compile("decode", zj)
        c.record["compile_s"] = time.perf_counter() - start
        stats, out = common.time_calls(lambda: vae.decode(zj), c.repeats, jax.block_until_ready)
        c.save(np.asarray(out.astype(jnp.float32)))
        c.record.update(jax_memory(compiled), device=jax.devices()[0].device_kind)
        c.record["precision"] = str(getattr(vae, "precision", None))
        c.record["xla_flags"] = os.environ.get("XLA_FLAGS", "")
    c.finish(stats, flops)


def child_umt5(c: Child) -> None:
    root = c.work / "weights" / "umt5"
    batch, length = c.sizes.umt5_tokens
    vocab = c.sizes.umt5["vocab_size"]
    ids = np.random.default_rng(5).integers(3, vocab, (batch, length))
    ids[:, -1] = 1  # </s>
    mask = np.ones_like(ids)
    if c.side == "transformers":
        torch, dev = torch_env()
        from transformers import UMT5EncoderModel

        model = UMT5EncoderModel.from_pretrained(root / "text_encoder", dtype=getattr(torch, c.case))
        model = model.to(dev).eval()
        t_ids, t_mask = torch.from_numpy(ids).to(dev), torch.from_numpy(mask).to(dev)
        with torch.inference_mode():
            stats, out = common.time_calls(
                lambda: model(t_ids, t_mask).last_hidden_state, c.repeats, torch_sync(torch)
            )
        c.save(out.float().cpu().numpy())
        c.record.update(torch_memory(torch), device=dev)
    else:
        import jax
        import jax.numpy as jnp

        from wanjax.models.umt5 import UMT5Encoder, load_encoder_params

        cfg, params = load_encoder_params(root, c.case)
        encoder = UMT5Encoder(cfg, params, tokenizer=None)
        stats, out = common.time_calls(
            lambda: encoder.encode_ids(ids, mask), c.repeats, jax.block_until_ready
        )
        c.save(np.asarray(out.astype(jnp.float32)))
        c.record.update(jax_memory(), device=jax.devices()[0].device_kind)

    def flops() -> float:
        from wanjax.models.umt5 import UMT5Config
        from wanjax.tools.flops import umt5_flops

        return umt5_flops(UMT5Config.from_file(root / "text_encoder" / "config.json"), batch, length).total

    c.finish(stats, flops)


def attention_inputs(length: int, heads: int, dim: int) -> list[np.ndarray]:
    """q, k, v ``(1, L, H, D)``, rounded to bf16 (the same values on both sides)."""
    rng = np.random.default_rng(length)
    return [common.bf16_round(rng.standard_normal((1, length, heads, dim), dtype=np.float32)) for _ in "qkv"]


def child_attention(c: Child) -> None:
    length, heads, dim = (int(x) for x in re.findall(r"\d+", c.case))
    q, k, v = attention_inputs(length, heads, dim)

    def flops() -> float:
        from wanjax.tools.flops import attention_flops

        return attention_flops(1, heads, length, length, dim)

    check = c.sizes.attention_check
    if c.side.startswith("torch"):
        torch, dev = torch_env()
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        qt, kt, vt = (
            torch.from_numpy(a).to(dev, torch.bfloat16).transpose(1, 2).contiguous() for a in (q, k, v)
        )
        del q, k, v
        backend = {"torch cudnn": SDPBackend.CUDNN_ATTENTION, "torch flash": SDPBackend.FLASH_ATTENTION}

        def run() -> Any:
            if c.side in backend:
                with sdpa_kernel(backend[c.side]):
                    return F.scaled_dot_product_attention(qt, kt, vt)
            return F.scaled_dot_product_attention(qt, kt, vt)

        with torch.inference_mode():
            stats, out = common.time_calls(run, c.repeats, torch_sync(torch))
        c.save(out[:, :, :check].transpose(1, 2).float().cpu().numpy())
        c.record.update(torch_memory(torch), device=dev)
    else:
        import jax
        import jax.numpy as jnp

        from wanjax.kernels.attention import attention

        qj, kj, vj = (jnp.asarray(a, jnp.bfloat16) for a in (q, k, v))
        del q, k, v
        if c.side == "jax.nn cudnn":
            f = jax.jit(lambda a, b, d: jax.nn.dot_product_attention(a, b, d, implementation="cudnn"))
        elif c.side == "jax mosaic_gpu":
            from jax.experimental.pallas.ops.gpu import attention_mgpu

            config = attention_mgpu.TuningConfig(block_q=64, block_kv=128, max_concurrent_steps=2)
            kernel = functools.partial(attention_mgpu.attention, config=config, save_residuals=True)
            f = jax.jit(
                lambda a, b, d: mosaic_gpu_attention(a, b, d, kernel, config.block_q, config.block_kv)
            )
        else:
            name = c.side.split()[1]
            f = jax.jit(lambda a, b, d: attention(a, b, d, backend=name))
        stats, out = common.time_calls(lambda: f(qj, kj, vj), c.repeats, jax.block_until_ready)
        c.save(np.asarray(out[:, :check].astype(jnp.float32)))
        c.record.update(jax_memory(), device=jax.devices()[0].device_kind)
    c.finish(stats, flops)


def mosaic_gpu_attention(
    q: Any, k: Any, v: Any, kernel: Callable[..., Any], block_q: int = 64, block_kv: int = 128
):
    """The experiment of the ``jax mosaic_gpu`` side: JAX's Pallas Mosaic-GPU flash attention
    (``jax.experimental.pallas.ops.gpu.attention_mgpu``, Hopper, bf16) on ``(B, L, H, D)`` inputs of
    any length, as wanjax would run it: queries scaled by ``1/sqrt(D)`` (the kernel does not scale)
    and zero-padded to whole tiles; the keys the tiles cover through the kernel (which also returns
    each query's log2-sum-exp), the last ``L % block_kv`` keys (none at L = 32,768; 48 at 75,600)
    through a float32 einsum, and the two parts merged by their sum-exps. ``kernel(q, k, v) -> (out,
    (lse,))``: the kernel with its residuals, or ``attention_mgpu.attention_reference`` with
    ``save_residuals=True`` (the same contract, any platform) to check the merge."""
    import jax.numpy as jnp

    f32 = jnp.float32
    lq, d = q.shape[1], q.shape[3]
    covered = k.shape[1] - k.shape[1] % block_kv
    qs = (q.astype(f32) * d**-0.5).astype(q.dtype)
    padded = jnp.pad(qs, ((0, 0), (0, -lq % (2 * block_q)), (0, 0), (0, 0)))
    # the kernel's shared-memory scratch is float16 whatever the inputs (jax 0.11.2 rejects bf16 there)
    f16 = jnp.float16
    out, (lse,) = kernel(padded.astype(f16), k[:, :covered].astype(f16), v[:, :covered].astype(f16))
    out, lse = out[:, :lq].astype(f32), lse[:, :, :lq].transpose(0, 2, 1)  # lse: (B, L, H), log2
    if covered == k.shape[1]:
        return out.astype(q.dtype)
    s = jnp.einsum("bqhd,bkhd->bqhk", qs.astype(f32), k[:, covered:].astype(f32)) * 1.4426950408889634
    m = s.max(-1, keepdims=True)
    p = jnp.exp2(s - m)
    rest = jnp.einsum("bqhk,bkhd->bqhd", p, v[:, covered:].astype(f32)) / p.sum(-1, keepdims=True)
    lse_rest = m[..., 0] + jnp.log2(p.sum(-1))
    top = jnp.maximum(lse, lse_rest)
    w, w_rest = jnp.exp2(lse - top)[..., None], jnp.exp2(lse_rest - top)[..., None]
    return ((out * w + rest * w_rest) / (w + w_rest)).astype(q.dtype)


CHILDREN: dict[str, Callable[[Child], None]] = {
    "matmul": child_matmul,
    "dit": child_dit,
    "dit14b": child_dit,
    "sampler": child_sampler,
    "vae": child_vae,
    "umt5": child_umt5,
    "attention": child_attention,
}


# ----------------------------------------------------------------------------------------------
# Weights (one child per model, saved once into the work folder) and the environment probe


def prepare(model: str, sizes: Sizes, work: Path) -> None:
    """Random weights of ``model`` saved with ``save_pretrained`` under ``work/weights/<model>``."""
    import torch

    root = work / "weights" / model
    start = time.perf_counter()
    if model in ("dit", "dit14b"):
        from diffusers import WanTransformer3DModel

        torch.set_default_dtype(torch.bfloat16)  # built in bf16: half the memory of a float32 build
        net = WanTransformer3DModel(**(sizes.dit if model == "dit" else sizes.dit14b))
        torch.set_default_dtype(torch.float32)
        common.randomize_like_wanjax(net, seed=0).to(torch.bfloat16).save_pretrained(root / "transformer")
    elif model == "vae":
        from diffusers import AutoencoderKLWan

        common.randomize_like_wanjax(AutoencoderKLWan(**sizes.vae), seed=1).save_pretrained(root / "vae")
    elif model == "umt5":
        from transformers import UMT5Config, UMT5EncoderModel

        torch.set_default_dtype(torch.bfloat16)
        net = UMT5EncoderModel(UMT5Config(**sizes.umt5))
        torch.set_default_dtype(torch.float32)
        gen = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for p in net.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * UMT5_STD)
        net.save_pretrained(root / "text_encoder")
    else:
        raise ValueError(model)
    (root / "READY").write_text(f"{time.perf_counter() - start:.1f} s\n")


def probe() -> None:
    """The environment: versions, devices, CUDA."""
    import diffusers
    import jax
    import torch
    import transformers

    common.emit(
        {
            "environment": True,
            "cuda": bool(torch.cuda.is_available()),
            "jax": jax.__version__,
            "jax_devices": [d.device_kind for d in jax.devices()],
            "torch": torch.__version__,
            "torch_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
            "torch_threads": torch.get_num_threads(),
            "diffusers": diffusers.__version__,
            "transformers": transformers.__version__,
            "cpus": os.cpu_count(),
        }
    )


# ----------------------------------------------------------------------------------------------
# The parent


def describe(r: dict[str, Any]) -> str:
    """One line of text for a record."""
    head = f"{r.get('part', ''):9} {r.get('case', ''):24} {r.get('side', ''):19}"
    if "skipped" in r:
        return f"{head} skipped: {r['skipped']}"
    if "error" in r:
        return f"{head} FAILED: {r['error']}"
    if "rel_err" in r:
        return f"{r['part']:9} {r['case']:24} rel. error {r['rel_err']:.2e} ({r['compare']})"
    text = f"{head} median {r['median_s']:.4g} s (min {r['min_s']:.4g}; first {r['first_s']:.3g} s"
    text += f"; compile {r['compile_s']:.3g} s)" if "compile_s" in r else ")"
    if "tflops" in r:
        text += f" {r['tflops']:.4g} TFLOP/s"
    text += f", peak {common.size(r.get('peak_bytes'))}"
    if r.get("peak_bytes") is None:
        text += f" (RSS {common.size(r.get('peak_rss_bytes'))})"
    program = r.get("program_memory")
    if program:
        text += (
            f", program {common.size(program['total_bytes'])} (temp {common.size(program['temp_bytes'])}, "
            f"memory_analysis)"
        )
    return text


class Parent:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.sizes = SMALL if args.small else FULL
        self.work = Path(args.workdir)
        self.out = Path(args.out) if args.out else None
        self.records: list[dict[str, Any]] = []
        self.cuda = False

    def record(self, r: dict[str, Any]) -> None:
        r = {**r, "small": self.args.small, "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
        self.records.append(r)
        if self.out:
            with self.out.open("a") as f:
                f.write(json.dumps(r) + "\n")
        if "environment" in r:
            self.cuda = r["cuda"]
            print("environment: " + ", ".join(f"{k} {v}" for k, v in r.items() if k not in ("environment",)))
        else:
            print(describe(r), flush=True)

    def child(self, *extra: str, env: dict[str, str] | None = None) -> tuple[int | None, list[str]]:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--workdir", str(self.work)]
        cmd += ["--repeats", str(self.args.repeats)] + (["--small"] if self.args.small else [])
        if self.args.vae_precision:
            cmd += ["--vae_precision", self.args.vae_precision]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # so the allocator's peak means something
        echo = (
            (lambda line: print("    | " + line, file=sys.stderr, flush=True)) if self.args.verbose else None
        )
        return common.run_child(
            [*cmd, "--child", *extra], self.record, env=env, timeout=self.args.timeout, echo=echo
        )

    def ensure_weights(self, model: str) -> bool:
        root = self.work / "weights" / model
        if (root / "READY").exists():
            return True
        shutil.rmtree(root, ignore_errors=True)
        start = time.perf_counter()
        status, tail = self.child("prepare", model)
        if status != 0:
            self.record({"part": model, "case": "weights", "side": "prepare", "error": failure(status, tail)})
            return False
        print(f"weights {model}: saved in {time.perf_counter() - start:.1f} s under {root}", flush=True)
        return True

    def run(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        status, tail = self.child("probe")
        if status != 0:
            raise SystemExit("the environment probe failed:\n" + "\n".join(tail))
        for part in self.args.parts:
            self.run_part(part)
        if self.out:
            print(f"records appended to {self.out}")

    def run_part(self, part: str) -> None:
        if part in WEIGHTS and not self.ensure_weights(WEIGHTS[part]):
            return
        done = set()
        for case, side in plan(part, self.sizes):
            output_path(self.work, part, case, side).unlink(missing_ok=True)
            reason = skip_reason(part, side, self.cuda, self.args.vae_sides)
            if reason:
                self.record({"part": part, "case": case, "side": side, "skipped": reason})
                continue
            variant = VAE_VARIANTS.get(side) if part == "vae" else None
            env = None
            if variant and variant.xla_flags:
                env = {"XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {variant.xla_flags}".strip()}
            status, tail = self.child(part, case, side, env=env)
            if status != 0:
                self.record({"part": part, "case": case, "side": side, "error": failure(status, tail)})
            else:
                done.add((case, side))
        for (case, side), (ref_case, ref_side) in comparisons(part, self.sizes):
            if (case, side) in done and (ref_case, ref_side) in done:
                a = np.load(output_path(self.work, part, case, side))
                b = np.load(output_path(self.work, part, ref_case, ref_side))
                label = f"{side} vs {ref_side}" + (f" {ref_case}" if ref_case != case else "")
                self.record(
                    {"part": part, "case": case, "compare": label, "rel_err": common.relative_error(a, b)}
                )


EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b")


def failure(status: int | None, tail: list[str]) -> str:
    what = "timed out" if status is None else f"exit status {status}"
    lines = [line.strip() for line in tail if line.strip()]
    # the exception's own line: JAX prints a note on its filtered traceback after it
    last = next((line for line in reversed(lines) if EXCEPTION_LINE.match(line)), lines[-1] if lines else "")
    return f"{what}: {last.strip()[:300]}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--parts", nargs="+", default=list(PARTS), choices=PARTS, help="parts to run (default all)"
    )
    parser.add_argument("--small", action="store_true", help="tiny sizes: a smoke run (CPU: a minute or two)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls after the warm-up (default 3)")
    parser.add_argument("--out", help="append every record to this JSON-lines file")
    parser.add_argument(
        "--workdir",
        help="weights and outputs; the weights are kept for later runs (default: a folder under the "
        "system's temporary directory, one for full and one for --small sizes)",
    )
    parser.add_argument("--fresh", action="store_true", help="draw and save the weights again")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per measurement (default 1800)")
    parser.add_argument("--vae_precision", help="wanjax VAE float32 precision: highest, high or default")
    parser.add_argument(
        "--vae-sides",
        nargs="*",
        choices=list(VAE_VARIANTS),
        help="which wanjax VAE variants run beside the default decode (default: all)",
    )
    parser.add_argument("--verbose", action="store_true", help="pass the children's output through (stderr)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.workdir is None:
        name = "wanjax-gpu-vs-diffusers" + ("-small" if args.small else "")
        args.workdir = str(Path(tempfile.gettempdir()) / name)
    sizes = SMALL if args.small else FULL
    work = Path(args.workdir)
    if args.child:
        kind, *rest = args.child
        if kind == "probe":
            probe()
        elif kind == "prepare":
            prepare(rest[0], sizes, work)
        else:
            part, case, side = args.child
            CHILDREN[part](Child(part, case, side, sizes, work, args.repeats, args))
        return
    if args.fresh:
        shutil.rmtree(work / "weights", ignore_errors=True)
    Parent(args).run()


if __name__ == "__main__":
    main()
