"""The tiny random diffusers Wan pipeline of the parity tests: its components, saving it, a reference run."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from helpers.compare import to_uint8
from helpers.models import TINY_DIT, randomize_

PROMPT = "A cat &amp; a dog  run over the lazy fox"
NEGATIVE = "blurry, static"
# diffusers' hook on the block that decides a cached step, per cache policy
LEADER = {
    "magcache": "mag_cache_leader_block_hook",
    "firstblock": "fbc_leader_block_hook",
    "seacache": "sea_cache_leader_block",
}
TEXT = dict(vocab_size=330, d_model=24, d_kv=8, num_heads=3, d_ff=40, num_layers=2)


def reference_run(
    pipe: Any,
    height: int,
    width: int,
    frames: int,
    steps: int,
    latents: Any,
    on_step: Callable[..., Any] | None = None,
    prompts: Sequence[str] = (PROMPT,),
    **kwargs: Any,
) -> tuple[np.ndarray, np.ndarray]:
    """A diffusers pipeline's run of ``prompts`` (each with NEGATIVE) from ``latents`` (guidance 5.0
    unless given): its last step's latents (as the step callback sees them) and its uint8 frames.
    ``on_step(pipe, i, t, callback_kwargs)`` is called at the end of each step too."""
    final = []

    def callback(p: Any, i: int, t: Any, kw: dict[str, Any]) -> dict[str, Any]:
        final.append(kw["latents"].clone())
        if on_step is not None:
            on_step(p, i, t, kw)
        return {}

    with torch.no_grad():
        video = pipe(
            prompt=list(prompts),
            negative_prompt=[NEGATIVE] * len(prompts),
            height=height,
            width=width,
            num_frames=frames,
            num_inference_steps=steps,
            latents=latents,
            output_type="np",
            callback_on_step_end=callback,
            **{"guidance_scale": 5.0, **kwargs},
        ).frames
    return final[-1].numpy(), to_uint8(video)


def tiny_components(tokenizer_dir: Path, **transformer: Any) -> dict[str, Any]:
    """The random tiny components of a diffusers Wan pipeline (``transformer``: config overrides, e.g.
    an image-to-video transformer's)."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanTransformer3DModel
    from transformers import AutoTokenizer, UMT5EncoderModel
    from transformers import UMT5Config as HFConfig

    return {
        "tokenizer": AutoTokenizer.from_pretrained(tokenizer_dir),
        "text_encoder": randomize_(UMT5EncoderModel(HFConfig(**TEXT)), seed=1).eval(),
        "transformer": randomize_(
            WanTransformer3DModel(**{**TINY_DIT, "text_dim": TEXT["d_model"], **transformer}), seed=2, std=0.2
        ).eval(),
        "vae": randomize_(
            AutoencoderKLWan(
                base_dim=8,
                z_dim=16,
                dim_mult=[1, 2, 2, 2],
                num_res_blocks=1,
                temperal_downsample=[False, True, True],
            ),
            seed=3,
            std=0.2,
        ).eval(),
        "scheduler": UniPCMultistepScheduler(
            prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0
        ),
    }


def save_tiny(pipe: Any, root: Path, tokenizer_dir: Path) -> None:
    """``save_pretrained``, with the Wan repos' tokenizer folder layout (tokenizer.json from T5Converter)."""
    pipe.save_pretrained(root)
    shutil.rmtree(root / "tokenizer")
    shutil.copytree(tokenizer_dir, root / "tokenizer")


def build_tiny_pipeline(root: Path, tokenizer_dir: Path) -> None:
    """A tiny random diffusers WanPipeline saved at ``root`` (also used by
    ``benchmarks/pipeline_vs_diffusers.py``)."""
    from diffusers import WanPipeline

    save_tiny(WanPipeline(**tiny_components(tokenizer_dir)), root, tokenizer_dir)


def branch_decisions(transformer: Any, policy: str) -> dict[str, bool]:
    """Whether each CFG branch ran the blocks at the step just run, read from the state of diffusers'
    leader hook (SeaCache's: its skip count restarted; TaylorSeer's hook on the output projection:
    its factors updated at this step)."""
    if policy == "taylorseer":
        hook = transformer.proj_out._diffusers_hook.get_hook("taylorseer_cache")
        states = hook.state_manager._state_cache
        return {n: states[n].last_update_step == states[n].current_step for n in ("cond", "uncond")}
    states = transformer.blocks[0]._diffusers_hook.get_hook(LEADER[policy]).state_manager._state_cache
    if policy == "seacache":
        return {name: states[name].consecutive_cached == 0 for name in ("cond", "uncond")}
    return {name: bool(states[name].should_compute) for name in ("cond", "uncond")}
