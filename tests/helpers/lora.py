"""LoRA files in the original Wan naming and through peft, for the tiny DiT, and a pipeline stand-in for diffusers' loader."""

from __future__ import annotations

import numpy as np
import torch
from diffusers import WanTransformer3DModel
from diffusers.loaders import WanLoraLoaderMixin
from peft import LoraConfig

from helpers.models import TINY_DIT

# Original Wan module -> its (out, in) in the tiny models
WAN_BLOCK = {
    **{f"self_attn.{o}": (24, 24) for o in "qkvo"},
    **{f"cross_attn.{o}": (24, 24) for o in "qkvo"},
    "ffn.0": (32, 24),
    "ffn.2": (24, 32),
}


WAN_I2V = {"cross_attn.k_img": (24, 24), "cross_attn.v_img": (24, 24)}


WAN_OTHER = {
    "time_projection.1": (144, 24),
    "head.head": (64, 24),
    "text_embedding.0": (24, 32),
    "text_embedding.2": (24, 24),
    "time_embedding.0": (24, 16),
    "time_embedding.2": (24, 24),
}


WAN_IMG = {"img_emb.proj.1": (20, 20), "img_emb.proj.3": (24, 20)}


class _Pipe(WanLoraLoaderMixin):
    """What ``WanPipeline.load_lora_weights`` needs of a pipeline: its transformer."""

    hf_device_map = None

    def __init__(self, transformer):
        self.transformer = transformer
        self.components = {"transformer": transformer}


def rand(gen: torch.Generator, *shape: int, dtype=torch.float32) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * 0.5).to(dtype)


def add_factors(
    sd, gen, key, shape, rank, *, alpha=None, names=("lora_down", "lora_up"), dtype=torch.float32
):
    out, inp = shape
    sd[f"{key}.{names[0]}.weight"] = rand(gen, rank, inp, dtype=dtype)
    sd[f"{key}.{names[1]}.weight"] = rand(gen, out, rank, dtype=dtype)
    if alpha is not None:
        sd[f"{key}.alpha"] = torch.tensor(alpha, dtype=dtype)


def peft_transformer(config: LoraConfig, seed: int = 3, model_config=TINY_DIT) -> WanTransformer3DModel:
    """A tiny transformer with a PEFT adapter whose weights are all random (lora_B included)."""
    torch.manual_seed(seed)
    model = WanTransformer3DModel(**model_config).eval()
    model.add_adapter(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(rand(gen, *p.shape))
    return model


def wan_original(gen, *, names=("lora_down", "lora_up"), dtype=torch.float32, i2v=False) -> dict:
    """diffusion_model.* LoRA over all block projections and the embedders; alpha on the block ones."""
    sd = {}
    for i in range(2):
        for module, shape in {**WAN_BLOCK, **(WAN_I2V if i2v else {})}.items():
            # alpha / rank: 1/8 (scale split between the factors), 12/8, and none on ffn.2
            alpha = None if module == "ffn.2" else (1.0 if i == 0 else 12.0)
            add_factors(
                sd,
                gen,
                f"diffusion_model.blocks.{i}.{module}",
                shape,
                8,
                alpha=alpha,
                names=names,
                dtype=dtype,
            )
    for module, shape in {**WAN_OTHER, **(WAN_IMG if i2v else {})}.items():
        add_factors(sd, gen, f"diffusion_model.{module}", shape, 4, names=names, dtype=dtype)
    return sd


def diffusers_lora_for(cfg, path, seed: int, rank: int = 4, std: float = 0.3) -> None:
    """A PEFT-keyed LoRA (``transformer.blocks.N.attn1.to_q.lora_A.weight``, alpha = rank) over every
    block's self-attention and feed-forward projections of a transformer of config ``cfg``."""
    from safetensors.numpy import save_file as save_numpy

    rng = np.random.default_rng(seed)
    inner = cfg.num_attention_heads * cfg.attention_head_dim
    shapes = {**{f"attn1.{p}": (inner, inner) for p in ("to_q", "to_k", "to_v", "to_out.0")}}
    shapes |= {"ffn.net.0.proj": (cfg.ffn_dim, inner), "ffn.net.2": (inner, cfg.ffn_dim)}
    state = {}
    for layer in range(cfg.num_layers):
        for module, (out, inp) in shapes.items():
            key = f"transformer.blocks.{layer}.{module}"
            state[f"{key}.lora_A.weight"] = (rng.standard_normal((rank, inp)) * std).astype(np.float32)
            state[f"{key}.lora_B.weight"] = (rng.standard_normal((out, rank)) * std).astype(np.float32)
    save_numpy(state, str(path))


def save_factors(path, factors: dict) -> None:
    """``{module: (A, B)}`` written as diffusers' ``transformer.MODULE.lora_A/B.weight`` file."""
    from safetensors.numpy import save_file

    tensors = {
        f"transformer.{m}.lora_{n}.weight": f
        for m, (a, b) in factors.items()
        for n, f in (("A", a), ("B", b))
    }
    save_file(tensors, str(path))
