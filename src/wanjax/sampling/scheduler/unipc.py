"""UniPC-bh flow sampler (diffusers ``UniPCMultistepScheduler``): host coefficient table and traced step.

The per-step scalars are computed once in numpy float32 following torch's operation order; ``step`` gathers
one row by ``step_index`` and applies a few elementwise multiply-adds.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from wanjax.sampling.scheduler.config import SchedulerConfig
from wanjax.sampling.scheduler.ops import scalar_times, true_div
from wanjax.sampling.scheduler.sigmas import unipc_flow_schedule
from wanjax.sampling.scheduler.strength import PartialStart

__all__ = ["UNIPC_COEFFICIENTS", "UniPCFlowScheduler", "UniPCState"]

_F32 = np.float32

# ----------------------------------------------------------------------------------------------------
# Host-side float32 scalar math mirroring the reference's torch ops on 0-d float32 tensors.


def _log32(x: np.float32) -> np.float32:
    with np.errstate(divide="ignore"):
        return _F32(np.log(np.float64(x)))


def _expm1_32(x: np.float32) -> np.float32:
    return _F32(np.expm1(np.float64(x)))


def _fma32(a: np.float32, b: np.float32, c: np.float32) -> np.float32:
    # a*b is exact in float64; one extra rounding of the sum is harmless at these magnitudes.
    return _F32(np.float64(a) * np.float64(b) + np.float64(c))


def _solve_2x2(rk: np.float32, b1: np.float32, b2: np.float32) -> tuple[np.float32, np.float32]:
    """Solve ``[[1, 1], [rk, 1]] @ rho = [b1, b2]`` as torch.linalg.solve (MKL sgesv) does in float32."""
    one = _F32(1)
    if abs(rk) > one:  # partial pivoting swaps the rows
        a11, a21, y1, y2 = rk, one, b2, b1
    else:
        a11, a21, y1, y2 = one, rk, b1, b2
    l21 = a21 * (one / a11)
    u22 = _fma32(-l21, one, one)
    y2 = _fma32(-l21, y1, y2)
    rho1 = y2 * (one / u22)
    y1 = _fma32(-rho1, one, y1)
    rho0 = y1 * (one / a11)
    return rho0, rho1


# Column layout of the UniPC per-step coefficient table.
UNIPC_COEFFICIENTS = (
    "sigma",
    "use_corrector",
    "c_ratio",
    "c_alpha_phi1",
    "c_alpha_b",
    "c_rk",
    "c_rho0",
    "c_rho1",
    "p_ratio",
    "p_alpha_phi1",
    "p_alpha_b",
    "p_rk",
)
_SIGMA, _USE_C, _C_R, _C_A, _C_B, _C_RK, _C_RHO0, _C_RHO1, _P_R, _P_A, _P_B, _P_RK = range(12)
_N_COLS = len(UNIPC_COEFFICIENTS)


def _unipc_table(
    sigmas: np.ndarray,
    solver_order: int,
    solver_type: str,
    disable_corrector: tuple[int, ...],
    start: int = 0,
) -> np.ndarray:
    """Per-step scalar coefficients (float32, shape (N, 12)) of UniPC-bh with predict_x0 and flow sigmas.

    Step i computes, with m = x - sigma*v, (m1, m2) the two previous x0 predictions and ``last`` the
    corrected previous sample (column names as in ``UNIPC_COEFFICIENTS``):
      corrector (if use_corrector):
        x <- (c_ratio*last - c_alpha_phi1*m1) - c_alpha_b*(c_rho0*((m2 - m1)/c_rk) + c_rho1*(m - m1))
      predictor:
        x' = (p_ratio*x - p_alpha_phi1*m) - p_alpha_b*(0.5*((m1 - m)/p_rk))
    Unused terms have zero coefficients and unit divisors, so they add exact zeros. A run that starts
    at step ``start`` warms up from there (first order, no corrector at ``start``: no earlier output).
    """
    n = len(sigmas) - 1
    sig = [_F32(s) for s in sigmas]
    alpha = [_F32(1) - s for s in sig]
    lam = [_log32(a) - _log32(s) for a, s in zip(alpha, sig, strict=True)]  # lam[n] = +inf
    order = [max(1, min(solver_order, n - i, i - start + 1)) for i in range(n)]  # lower_order_final + warm-up
    table = np.zeros((n, _N_COLS), np.float32)
    table[:, _C_RK] = 1
    table[:, _P_RK] = 1
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for i in range(n):
            row = table[i]
            row[_SIGMA] = sig[i]
            # UniP from sigma_i to sigma_{i+1}.
            h = lam[i + 1] - lam[i]
            hh = -h
            phi1 = _expm1_32(hh)
            b_h = hh if solver_type == "bh1" else phi1
            row[_P_R] = sig[i + 1] / sig[i]
            row[_P_A] = alpha[i + 1] * phi1
            if order[i] == 2:
                row[_P_RK] = (lam[i - 1] - lam[i]) / h
                row[_P_B] = alpha[i + 1] * b_h
            # UniC correcting the sample predicted by step i-1 (order of that predictor).
            if i <= start or (i - 1) in disable_corrector:
                continue
            q = order[i - 1]
            h = lam[i] - lam[i - 1]
            hh = -h
            phi1 = _expm1_32(hh)
            b_h = hh if solver_type == "bh1" else phi1
            row[_USE_C] = 1
            row[_C_R] = sig[i] / sig[i - 1]
            row[_C_A] = alpha[i] * phi1
            row[_C_B] = alpha[i] * b_h
            if q == 1:
                row[_C_RHO1] = 0.5
            else:
                rk = (lam[i - 2] - lam[i - 1]) / h
                h_phi_k = phi1 / hh - _F32(1)
                b1 = (h_phi_k * _F32(1)) / b_h
                h_phi_k = h_phi_k / hh - _F32(0.5)
                b2 = (h_phi_k * _F32(2)) / b_h
                row[_C_RK] = rk
                row[_C_RHO0], row[_C_RHO1] = _solve_2x2(rk, b1, b2)
    return table


class UniPCState(NamedTuple):
    """UniPC sampling state (a pytree of float32 arrays, all shaped like the latents).

    ``sample``: x_i, the latents the model is evaluated at next. ``last_sample``: the corrected x_{i-1}
    (input of the previous predictor). ``x0_prev``/``x0_prev2``: x0 predictions m_{i-1}, m_{i-2}.
    """

    sample: jax.Array
    last_sample: jax.Array
    x0_prev: jax.Array
    x0_prev2: jax.Array


class UniPCFlowScheduler(PartialStart):
    """diffusers ``UniPCMultistepScheduler`` (flow sigmas, predict-x0, order <= 2) for a fixed step count.

    Attributes: ``timesteps`` (numpy int64, N values, fed to the model), ``sigmas`` (numpy float32,
    N+1 values, last 0), ``num_inference_steps``, ``config``, ``start`` (the first step run: 0, or
    where a ``strength`` starts, :mod:`~wanjax.sampling.scheduler.strength`).

    One deliberate deviation: with ``solver_type="bh1"`` diffusers' final step computes
    ``(alpha * B_h) * 0`` with ``B_h = -inf`` and returns NaN; here the final step returns the last x0
    prediction (the value the bh2 path, and the limit, give). All other steps match.
    """

    kind: Literal["unipc"] = "unipc"

    def __init__(
        self, config: SchedulerConfig, num_inference_steps: int, strength: float | None = None
    ) -> None:
        self._flow_schedule(config, num_inference_steps, strength, unipc_flow_schedule)
        self._table = _unipc_table(
            self.sigmas, config.solver_order, config.solver_type, tuple(config.disable_corrector), self.start
        )

    @property
    def coefficients(self) -> dict[str, np.ndarray]:
        """The per-step scalar coefficient table, by name (see ``UNIPC_COEFFICIENTS``), for inspection."""
        return {name: self._table[:, k].copy() for k, name in enumerate(UNIPC_COEFFICIENTS)}

    def model_timestep(self, step_index: jax.Array | int) -> jax.Array:
        """The timestep the model is conditioned on at ``step_index`` (int32 scalar, traceable)."""
        return jnp.asarray(self.timesteps, jnp.int32)[step_index]

    def init_state(self, latents: jax.Array) -> UniPCState:
        """Initial state for the starting noise ``latents`` (kept in float32)."""
        x = jnp.asarray(latents, jnp.float32)
        zeros = jnp.zeros_like(x)
        return UniPCState(sample=x, last_sample=zeros, x0_prev=zeros, x0_prev2=zeros)

    def step(
        self, state: UniPCState, model_output: jax.Array, step_index: jax.Array | int
    ) -> tuple[UniPCState, jax.Array]:
        """One UniPC step: corrector on ``state.sample`` (from step 1), then predictor to step i+1.

        ``model_output`` is the flow velocity evaluated at ``state.sample`` (any float dtype; a bf16
        output is handled as diffusers does). ``step_index`` must be in 0..N-1 and may be a traced
        int32 scalar (a traced index is not range-checked). Returns ``(new_state, prev_sample)`` with
        ``prev_sample is new_state.sample`` (float32). The last step returns exactly the x0 prediction.
        """
        c = jnp.asarray(self._table)[step_index]
        x = state.sample
        m1, m2 = state.x0_prev, state.x0_prev2
        m = x - scalar_times(c[_SIGMA], model_output)
        corrected = (c[_C_R] * state.last_sample - c[_C_A] * m1) - c[_C_B] * (
            c[_C_RHO0] * true_div(m2 - m1, c[_C_RK]) + c[_C_RHO1] * (m - m1)
        )
        x = jnp.where(c[_USE_C] > 0, corrected, x)
        x_next = (c[_P_R] * x - c[_P_A] * m) - c[_P_B] * (0.5 * true_div(m1 - m, c[_P_RK]))
        return UniPCState(sample=x_next, last_sample=x, x0_prev=m, x0_prev2=m1), x_next
