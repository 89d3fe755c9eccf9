"""The TeaCache authors' Wan 2.1 decisions around a diffusers transformer's block list, the reference
wanjax's ``--cache teacache`` is compared with.

Transcribed from ``teacache_forward`` (github.com/ali-vilab/TeaCache, TeaCache4Wan2.1/
teacache_generate.py @ 7c10efc, lines 519-581, and the settings of lines 868-894): one counter over
every transformer call (even: the conditional pass, odd: the unconditional one, as diffusers'
WanPipeline calls them), per branch an accumulated ``np.poly1d(coefficients)`` of the modulated
input's relative L1 change and a cached residual of the blocks. diffusers' ``temb`` is the authors'
``e``, its ``timestep_proj`` their ``e0``.
"""

from __future__ import annotations

import numpy as np
import torch


class AuthorsTeaCache(torch.nn.Module):
    """Stands in for ``transformer.blocks`` (a one-module list around the real blocks); see :func:`install`."""

    def __init__(self, blocks, coefficients, thresh: float, use_ret_steps: bool, sample_steps: int):
        super().__init__()
        self.inner = blocks
        self.coefficients, self.teacache_thresh, self.use_ref_steps = coefficients, thresh, use_ret_steps
        self.num_steps = sample_steps * 2
        self.ret_steps = 5 * 2 if use_ret_steps else 1 * 2
        self.cutoff_steps = sample_steps * 2 if use_ret_steps else sample_steps * 2 - 2
        self.cnt = 0
        self.accumulated = {True: 0.0, False: 0.0}
        self.previous_e0: dict[bool, torch.Tensor] = {}
        self.previous_residual: dict[bool, torch.Tensor] = {}
        self.temb: torch.Tensor | None = None  # set by the condition embedder's hook
        self.calls: list[tuple[bool, bool]] = []  # (even, computed) per call
        self.distances: list[float] = []  # every relative L1 change measured

    def forward(self, x, encoder_hidden_states, timestep_proj, rotary_emb):
        modulated_inp = timestep_proj if self.use_ref_steps else self.temb
        even = self.cnt % 2 == 0
        if self.cnt < self.ret_steps or self.cnt >= self.cutoff_steps:
            should_calc = True
            self.accumulated[even] = 0
        else:
            rescale_func = np.poly1d(self.coefficients)
            previous = self.previous_e0[even]
            distance = ((modulated_inp - previous).abs().mean() / previous.abs().mean()).cpu().item()
            self.distances.append(distance)
            self.accumulated[even] += rescale_func(distance)
            if self.accumulated[even] < self.teacache_thresh:
                should_calc = False
            else:
                should_calc = True
                self.accumulated[even] = 0
        self.previous_e0[even] = modulated_inp.clone()
        if not should_calc:
            x = x + self.previous_residual[even]
        else:
            ori_x = x.clone()
            for block in self.inner:
                x = block(x, encoder_hidden_states, timestep_proj, rotary_emb)
            self.previous_residual[even] = x - ori_x
        self.calls.append((even, should_calc))
        self.cnt += 1
        if self.cnt >= self.num_steps:
            self.cnt = 0
        return x

    def computed(self) -> dict[str, list[bool]]:
        """Per branch (``cond``: the even calls), whether each step ran the blocks."""
        return {
            "cond": [done for even, done in self.calls if even],
            "uncond": [done for even, done in self.calls if not even],
        }


def install(transformer, coefficients, thresh: float, use_ret_steps: bool, sample_steps: int):
    """Put the authors' TeaCache around ``transformer``'s blocks; returns it and an ``uninstall()``."""
    original = transformer.blocks
    tea = AuthorsTeaCache(original, coefficients, thresh, use_ret_steps, sample_steps)
    hook = transformer.condition_embedder.register_forward_hook(
        lambda module, args, out: setattr(tea, "temb", out[0])
    )
    transformer.blocks = torch.nn.ModuleList([tea])

    def uninstall() -> None:
        hook.remove()
        transformer.blocks = original

    return tea, uninstall
