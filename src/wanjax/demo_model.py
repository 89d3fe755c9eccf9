"""A small built-in model in the diffusers layout, with random weights, for demos and smoke runs.

It is written to disk as a real model directory (``model_index.json``, ``transformer/``,
``scheduler/``) and loaded back through exactly the code path real checkpoints use. Its outputs are
noise-like: it exercises the engine, it is not a trained model.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
from safetensors.numpy import save_file

import wanjax
from wanjax.checkpoint import LeafSource
from wanjax.config import TransformerConfig
from wanjax.models.dit import checkpoint_spec

DEMO_TRANSFORMER = TransformerConfig(
    num_attention_heads=4,
    attention_head_dim=32,
    text_dim=64,
    freq_dim=64,
    ffn_dim=256,
    num_layers=4,
    metadata={"_class_name": "WanTransformer3DModel"},
)
DEMO_SCHEDULER = {
    "_class_name": "UniPCMultistepScheduler",
    "num_train_timesteps": 1000,
    "solver_order": 2,
    "prediction_type": "flow_prediction",
    "use_flow_sigmas": True,
    "flow_shift": 3.0,
    "predict_x0": True,
    "solver_type": "bh2",
    "lower_order_final": True,
}


def checkpoint_tensors(spec: object, seed: int, std: float = 0.05) -> dict[str, np.ndarray]:
    """Random float32 tensors for every checkpoint name in a spec tree, in the checkpoint's layout."""
    rng = np.random.default_rng(seed)
    sources = jax.tree.leaves(spec, is_leaf=lambda x: isinstance(x, LeafSource))
    return {
        name: (rng.standard_normal(s.shape) * std).astype(np.float32) for s in sources for name in s.names
    }


def write_demo_model(directory: str | Path, seed: int = 0) -> Path:
    """Write the demo model to ``directory`` (created if needed) and return its path."""
    root = Path(directory)
    (root / "transformer").mkdir(parents=True, exist_ok=True)
    (root / "scheduler").mkdir(parents=True, exist_ok=True)
    save_file(
        checkpoint_tensors(checkpoint_spec(DEMO_TRANSFORMER), seed),
        str(root / "transformer" / "diffusion_pytorch_model.safetensors"),
    )
    (root / "transformer" / "config.json").write_text(json.dumps(DEMO_TRANSFORMER.to_dict(), indent=2))
    (root / "scheduler" / "scheduler_config.json").write_text(json.dumps(DEMO_SCHEDULER, indent=2))
    index = {
        "_class_name": "WanPipeline",
        "_wanjax_version": wanjax.__version__,
        "scheduler": ["diffusers", "UniPCMultistepScheduler"],
        "transformer": ["diffusers", "WanTransformer3DModel"],
    }
    (root / "model_index.json").write_text(json.dumps(index, indent=2))
    return root
