"""The flow-matching timestep/sigma tables diffusers builds for a step count, and that count's check."""

from __future__ import annotations

import numpy as np

from wanjax.errors import ConfigError

__all__ = ["check_steps", "euler_flow_schedule", "unipc_flow_schedule"]

_F32 = np.float32


def check_steps(num_inference_steps: int) -> int:
    """``num_inference_steps`` as an ``int``; :class:`ConfigError` unless it is an integer >= 1."""
    if isinstance(num_inference_steps, bool) or not isinstance(num_inference_steps, int | np.integer):
        raise ConfigError(f"num_inference_steps must be an integer >= 1, got {num_inference_steps!r}")
    if num_inference_steps < 1:
        raise ConfigError(f"num_inference_steps must be >= 1, got {num_inference_steps}")
    return int(num_inference_steps)


def unipc_flow_schedule(num_inference_steps: int, flow_shift: float, num_train_timesteps: int = 1000):
    """diffusers' ``UniPCMultistepScheduler.set_timesteps`` with flow sigmas: (timesteps int64, sigmas f32)."""
    n = num_inference_steps
    s = np.linspace(1, 1 / num_train_timesteps, n + 1)[:-1]
    s = flow_shift * s / (1 + (flow_shift - 1) * s)
    if np.fabs(s[0] - 1) < 1e-6:
        s[0] -= 1e-6
    timesteps = (s * num_train_timesteps).astype(np.int64)  # truncation, as torch's .to(int64)
    sigmas = np.concatenate([s, [0.0]]).astype(np.float32)
    return timesteps, sigmas


def euler_flow_schedule(num_inference_steps: int, shift: float, num_train_timesteps: int = 1000):
    """diffusers' ``FlowMatchEulerDiscreteScheduler`` init + ``set_timesteps``: (timesteps f32, sigmas f32)."""
    train_t = np.linspace(1, num_train_timesteps, num_train_timesteps, dtype=np.float32)[::-1]
    train_s = train_t / _F32(num_train_timesteps)
    train_s = _F32(shift) * train_s / (_F32(1) + _F32(shift - 1) * train_s)  # torch float32 ops
    sigma_max, sigma_min = float(train_s[0]), float(train_s[-1])
    t = np.linspace(sigma_max * num_train_timesteps, sigma_min * num_train_timesteps, num_inference_steps)
    s = t / num_train_timesteps
    s = shift * s / (1 + (shift - 1) * s)  # shifted a second time, in float64
    s32 = s.astype(np.float32)
    timesteps = s32 * _F32(num_train_timesteps)
    sigmas = np.concatenate([s32, np.zeros(1, np.float32)])
    return timesteps, sigmas
