"""Flow-matching samplers for Wan 2.1 as pure functions over an explicit state.

Two schedulers reproduce diffusers 0.42.1 for the configurations Wan ships with:

* :class:`UniPCFlowScheduler` — ``UniPCMultistepScheduler`` with ``use_flow_sigmas=True``,
  ``prediction_type="flow_prediction"``, ``predict_x0=True``, ``solver_order`` 1 or 2, ``bh1``/``bh2``
  (the Wan 2.1 T2V default).
* :class:`FlowEulerScheduler` — ``FlowMatchEulerDiscreteScheduler`` (plain Euler on the flow ODE).

Each scheduler is built on the host for a fixed number of steps. All scalar coefficients of every step
are precomputed in numpy float32, following the reference's torch float32 operation order (``log`` and
``expm1`` are evaluated in float64 and rounded, and the 2x2 corrector system is solved the way MKL's
``sgesv`` does: partial pivoting, FMA updates, reciprocal back-substitution). The traced ``step`` is
then a handful of elementwise multiply-adds with coefficients gathered by ``step_index``, which may be
a traced int32 scalar, so a step can run inside ``jax.jit``, ``lax.fori_loop`` or ``lax.scan``::

    sched = make_scheduler("Wan2.1-T2V-1.3B-Diffusers", num_inference_steps=50)
    state = sched.init_state(latents)
    def body(i, state):
        v = model(state.sample, sched.model_timestep(i))
        state, _ = sched.step(state, v, i)
        return state
    latents = jax.lax.fori_loop(0, sched.num_inference_steps, body, state).sample

``step(state, model_output, step_index)`` returns ``(new_state, prev_sample)``; ``new_state.sample``
holds the same values as ``prev_sample`` (always float32, so the state's dtype never changes).

Numerics: run op by op (eager), the steps are bit-identical to diffusers on CPU, bf16 model outputs
included (tests/test_scheduler.py). Under ``jit`` XLA fuses ``a*b + c`` into FMAs, so results then
differ from diffusers by a few float32 ulps (~3e-7 relative after 50 steps).
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from pathlib import Path
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from wanjax.errors import ConfigError

__all__ = [
    "UNIPC_COEFFICIENTS",
    "EulerState",
    "FlowEulerScheduler",
    "Scheduler",
    "SchedulerConfig",
    "UniPCFlowScheduler",
    "UniPCState",
    "load_scheduler_config",
    "make_scheduler",
]

UNIPC_CLASS = "UniPCMultistepScheduler"
EULER_CLASS = "FlowMatchEulerDiscreteScheduler"
SCHEDULER_KINDS = ("unipc", "euler", "auto")

_F32 = np.float32

# diffusers' constructor defaults for the keys SchedulerConfig models, per class: a key missing from a
# file gets the value diffusers itself would use (e.g. a UniPC file without ``prediction_type`` is an
# epsilon model, which is then rejected rather than silently run as a flow model).
_UNIPC_DEFAULTS: dict[str, Any] = {
    "num_train_timesteps": 1000,
    "solver_order": 2,
    "prediction_type": "epsilon",
    "use_flow_sigmas": False,
    "flow_shift": 1.0,
    "predict_x0": True,
    "solver_type": "bh2",
    "lower_order_final": True,
    "disable_corrector": (),
    "final_sigmas_type": "zero",
    "timestep_spacing": "linspace",
    "steps_offset": 0,
    "thresholding": False,
    "use_karras_sigmas": False,
    "use_exponential_sigmas": False,
    "use_beta_sigmas": False,
    "use_dynamic_shifting": False,
    "shift_terminal": None,
    "solver_p": None,
}
_EULER_DEFAULTS: dict[str, Any] = {
    "num_train_timesteps": 1000,
    "flow_shift": 1.0,  # the file's key is ``shift``
    "use_dynamic_shifting": False,
    "shift_terminal": None,
    "use_karras_sigmas": False,
    "use_exponential_sigmas": False,
    "use_beta_sigmas": False,
    "invert_sigmas": False,
    "stochastic_sampling": False,
}
_CLASS_DEFAULTS = {UNIPC_CLASS: _UNIPC_DEFAULTS, EULER_CLASS: _EULER_DEFAULTS}

# Keys diffusers accepts that cannot change the result for the supported configurations:
# beta-schedule fields (unused with flow sigmas), thresholding parameters (thresholding must be off),
# karras/exponential/beta bounds (those schedules are rejected), dynamic-shifting parameters (dynamic
# shifting is rejected), and ``variance_type``/``clip_sample*`` which these classes never read.
IGNORED_FIELDS: frozenset[str] = frozenset(
    {
        "beta_start",
        "beta_end",
        "beta_schedule",
        "trained_betas",
        "rescale_betas_zero_snr",
        "variance_type",
        "clip_sample",
        "clip_sample_range",
        "sample_max_value",
        "dynamic_thresholding_ratio",
        "sigma_min",
        "sigma_max",
        "base_shift",
        "max_shift",
        "base_image_seq_len",
        "max_image_seq_len",
        "time_shift_type",
    }
)


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    """The fields of a diffusers ``scheduler_config.json`` that decide the sampling math.

    The defaults are the scheduler config shipped with Wan 2.1 T2V (UniPC, flow shift 3.0).
    ``flow_shift`` is read from ``flow_shift`` (UniPC files) or ``shift`` (FlowMatchEuler files).
    ``steps_offset`` and ``timestep_spacing`` have no effect with flow sigmas (diffusers overwrites the
    timesteps they produce) but are kept for round-tripping.
    """

    class_name: str | None = UNIPC_CLASS
    num_train_timesteps: int = 1000
    solver_order: int = 2
    prediction_type: str = "flow_prediction"
    use_flow_sigmas: bool = True
    flow_shift: float = 3.0
    predict_x0: bool = True
    solver_type: str = "bh2"
    lower_order_final: bool = True
    disable_corrector: tuple[int, ...] = ()
    final_sigmas_type: str = "zero"
    timestep_spacing: str = "linspace"
    steps_offset: int = 0
    thresholding: bool = False
    use_karras_sigmas: bool = False
    use_exponential_sigmas: bool = False
    use_beta_sigmas: bool = False
    use_dynamic_shifting: bool = False
    shift_terminal: float | None = None
    solver_p: Any = None
    invert_sigmas: bool = False
    stochastic_sampling: bool = False

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "scheduler config") -> SchedulerConfig:
        """Parse a ``scheduler_config.json`` dict and validate it (raises :class:`ConfigError`).

        Keys missing from a dict whose ``_class_name`` is UniPC or FlowMatchEuler take diffusers' class
        defaults; a dict without ``_class_name`` takes this dataclass's (Wan 2.1) defaults. Keys in
        :data:`IGNORED_FIELDS` and metadata keys (``_*``) are ignored; any other unknown key is ignored
        with a warning.
        """
        if not isinstance(raw, dict):
            raise ConfigError(f"{source}: expected a JSON object, got {type(raw).__name__}")
        class_name = raw.get("_class_name")
        values: dict[str, Any] = dict(_CLASS_DEFAULTS.get(class_name, {}))
        known = {f.name for f in dataclasses.fields(cls)} - {"class_name"}
        unknown = []
        for key, value in raw.items():
            if key.startswith("_") or key in IGNORED_FIELDS:
                continue
            name = "flow_shift" if key == "shift" else key
            if name not in known:
                unknown.append(key)
                continue
            values[name] = value
        if "shift" in raw and "flow_shift" in raw and raw["shift"] != raw["flow_shift"]:
            raise ConfigError(
                f"{source}: both shift={raw['shift']} and flow_shift={raw['flow_shift']} are set"
            )
        if unknown:
            warnings.warn(
                f"{source}: ignoring unknown scheduler field(s) {', '.join(sorted(unknown))}",
                stacklevel=2,
            )
        if values.get("disable_corrector") is None:
            values["disable_corrector"] = ()
        if isinstance(values.get("disable_corrector"), list | tuple):
            values["disable_corrector"] = tuple(values["disable_corrector"])
        cfg = cls(class_name=class_name, **values)
        cfg.validate(source)
        return cfg

    @classmethod
    def from_pretrained(cls, path: str | Path) -> SchedulerConfig:
        """Read a model root dir, its ``scheduler/`` dir, or a ``scheduler_config.json`` file."""
        file = _find_config_file(Path(path))
        try:
            raw = json.loads(file.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{file}: not valid JSON ({e.msg} at line {e.lineno})") from None
        return cls.from_dict(raw, source=str(file))

    def to_dict(self) -> dict[str, Any]:
        """The config as a dict: ``_class_name`` included, the shift under ``shift`` for FlowMatchEuler.

        ``SchedulerConfig.from_dict(cfg.to_dict()) == cfg``.
        """
        out: dict[str, Any] = {}
        if self.class_name is not None:
            out["_class_name"] = self.class_name
        for f in dataclasses.fields(self):
            if f.name == "class_name":
                continue
            value = getattr(self, f.name)
            key = "shift" if (f.name == "flow_shift" and self.class_name == EULER_CLASS) else f.name
            out[key] = list(value) if isinstance(value, tuple) else value
        return out

    def validate(self, source: str = "scheduler config") -> None:
        """Raise :class:`ConfigError` for any value whose math wanjax does not implement."""

        def bad(field: str, supported: str) -> ConfigError:
            return ConfigError(
                f"{source}: {field}={getattr(self, field)!r} is not supported (supported: {supported})"
            )

        if not isinstance(self.num_train_timesteps, int) or self.num_train_timesteps < 1:
            raise bad("num_train_timesteps", "a positive integer")
        if isinstance(self.flow_shift, bool) or not isinstance(self.flow_shift, int | float):
            raise bad("flow_shift", "a positive number")
        if not (math.isfinite(self.flow_shift) and self.flow_shift > 0):
            raise bad("flow_shift", "a positive number")
        if self.prediction_type != "flow_prediction":
            raise bad("prediction_type", "'flow_prediction'")
        if not self.use_flow_sigmas:
            raise bad("use_flow_sigmas", "True")
        if self.solver_order not in (1, 2):
            raise bad("solver_order", "1, 2")
        if self.predict_x0 is not True:
            raise bad("predict_x0", "True")
        if self.solver_type not in ("bh1", "bh2"):
            raise bad("solver_type", "'bh1', 'bh2'")
        if self.lower_order_final is not True and self.solver_order > 1:
            # diffusers itself returns inf/NaN here: an order-2 final step divides by lambda=+inf.
            raise bad("lower_order_final", "True when solver_order=2 and final_sigmas_type='zero'")
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in self.disable_corrector):
            raise bad("disable_corrector", "a list of step indices")
        if self.final_sigmas_type != "zero":
            raise bad("final_sigmas_type", "'zero'")
        if self.timestep_spacing not in ("linspace", "leading", "trailing"):
            raise bad("timestep_spacing", "'linspace', 'leading', 'trailing'")
        if not isinstance(self.steps_offset, int):
            raise bad("steps_offset", "an integer")
        for flag in (
            "thresholding",
            "use_karras_sigmas",
            "use_exponential_sigmas",
            "use_beta_sigmas",
            "use_dynamic_shifting",
            "invert_sigmas",
            "stochastic_sampling",
        ):
            if getattr(self, flag):
                raise bad(flag, "False")
        if self.shift_terminal:  # diffusers treats None and 0 alike
            raise bad("shift_terminal", "None")
        if self.solver_p is not None:
            raise bad("solver_p", "None")


def _find_config_file(path: Path) -> Path:
    candidates = [path] if path.suffix == ".json" else [path / "scheduler" / "scheduler_config.json"]
    candidates += [path / "scheduler_config.json"]
    for c in candidates:
        if c.is_file():
            return c
    raise ConfigError(
        f"{path}: no scheduler config found (looked for {', '.join(str(c) for c in candidates)})"
    )


def load_scheduler_config(path_or_config: str | Path | dict[str, Any] | SchedulerConfig) -> SchedulerConfig:
    """A :class:`SchedulerConfig` from a model dir, ``scheduler/`` dir, json path, dict or config."""
    if isinstance(path_or_config, SchedulerConfig):
        path_or_config.validate()
        return path_or_config
    if isinstance(path_or_config, dict):
        return SchedulerConfig.from_dict(path_or_config)
    if isinstance(path_or_config, str | Path):
        return SchedulerConfig.from_pretrained(path_or_config)
    raise ConfigError(
        f"expected a path, dict or SchedulerConfig for the scheduler config, got {type(path_or_config).__name__}"
    )


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
    sigmas: np.ndarray, solver_order: int, solver_type: str, disable_corrector: tuple[int, ...]
) -> np.ndarray:
    """Per-step scalar coefficients (float32, shape (N, 12)) of UniPC-bh with predict_x0 and flow sigmas.

    Step i computes, with m = x - sigma*v, (m1, m2) the two previous x0 predictions and ``last`` the
    corrected previous sample (column names as in ``UNIPC_COEFFICIENTS``):
      corrector (if use_corrector):
        x <- (c_ratio*last - c_alpha_phi1*m1) - c_alpha_b*(c_rho0*((m2 - m1)/c_rk) + c_rho1*(m - m1))
      predictor:
        x' = (p_ratio*x - p_alpha_phi1*m) - p_alpha_b*(0.5*((m1 - m)/p_rk))
    Unused terms have zero coefficients and unit divisors, so they add exact zeros.
    """
    n = len(sigmas) - 1
    sig = [_F32(s) for s in sigmas]
    alpha = [_F32(1) - s for s in sig]
    lam = [_log32(a) - _log32(s) for a, s in zip(alpha, sig, strict=True)]  # lam[n] = +inf
    order = [min(solver_order, n - i, i + 1) for i in range(n)]  # lower_order_final + warm-up
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
            if i == 0 or (i - 1) in disable_corrector:
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


def _true_div(a: jax.Array, s: jax.Array) -> jax.Array:
    """``a / s`` for a scalar ``s``, rounded like an IEEE division (as torch does).

    XLA rewrites division by a broadcast scalar into multiplication by its reciprocal, which rounds
    differently; the barrier hides the broadcast from that rewrite.
    """
    return a / jax.lax.optimization_barrier(jnp.broadcast_to(s, a.shape))


def _scalar_times(sigma: jax.Array, model_output: jax.Array) -> jax.Array:
    """``sigma * model_output`` as torch computes a 0-d float32 tensor times a tensor; returns float32.

    For a bf16/fp16 ``model_output`` torch rounds ``sigma`` to that dtype, multiplies (exactly, in
    float32) and rounds the product to that dtype.
    """
    if model_output.dtype == jnp.float32:
        return sigma * model_output
    dt = model_output.dtype
    prod = sigma.astype(dt).astype(jnp.float32) * model_output.astype(jnp.float32)
    return prod.astype(dt).astype(jnp.float32)


class UniPCState(NamedTuple):
    """UniPC sampling state (a pytree of float32 arrays, all shaped like the latents).

    ``sample``: x_i, the latents the model is evaluated at next. ``last_sample``: the corrected x_{i-1}
    (input of the previous predictor). ``x0_prev``/``x0_prev2``: x0 predictions m_{i-1}, m_{i-2}.
    """

    sample: jax.Array
    last_sample: jax.Array
    x0_prev: jax.Array
    x0_prev2: jax.Array


class EulerState(NamedTuple):
    """Flow-Euler sampling state: ``sample`` as float32 (values already rounded to the model dtype)."""

    sample: jax.Array


def _check_steps(num_inference_steps: int) -> int:
    if isinstance(num_inference_steps, bool) or not isinstance(num_inference_steps, int | np.integer):
        raise ConfigError(f"num_inference_steps must be an integer >= 1, got {num_inference_steps!r}")
    if num_inference_steps < 1:
        raise ConfigError(f"num_inference_steps must be >= 1, got {num_inference_steps}")
    return int(num_inference_steps)


class UniPCFlowScheduler:
    """diffusers ``UniPCMultistepScheduler`` (flow sigmas, predict-x0, order <= 2) for a fixed step count.

    Attributes: ``timesteps`` (numpy int64, N values, fed to the model), ``sigmas`` (numpy float32,
    N+1 values, last 0), ``num_inference_steps``, ``config``.

    One deliberate deviation: with ``solver_type="bh1"`` diffusers' final step computes
    ``(alpha * B_h) * 0`` with ``B_h = -inf`` and returns NaN; here the final step returns the last x0
    prediction (the value the bh2 path, and the limit, give). All other steps match.
    """

    kind: Literal["unipc"] = "unipc"

    def __init__(self, config: SchedulerConfig, num_inference_steps: int) -> None:
        config.validate()
        self.config = config
        self.num_inference_steps = _check_steps(num_inference_steps)
        self.timesteps, self.sigmas = unipc_flow_schedule(
            self.num_inference_steps, float(config.flow_shift), config.num_train_timesteps
        )
        self._table = _unipc_table(
            self.sigmas, config.solver_order, config.solver_type, tuple(config.disable_corrector)
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
        m = x - _scalar_times(c[_SIGMA], model_output)
        corrected = (c[_C_R] * state.last_sample - c[_C_A] * m1) - c[_C_B] * (
            c[_C_RHO0] * _true_div(m2 - m1, c[_C_RK]) + c[_C_RHO1] * (m - m1)
        )
        x = jnp.where(c[_USE_C] > 0, corrected, x)
        x_next = (c[_P_R] * x - c[_P_A] * m) - c[_P_B] * (0.5 * _true_div(m1 - m, c[_P_RK]))
        return UniPCState(sample=x_next, last_sample=x, x0_prev=m, x0_prev2=m1), x_next


class FlowEulerScheduler:
    """diffusers ``FlowMatchEulerDiscreteScheduler`` (static shift) for a fixed step count.

    ``timesteps`` are float32 (``sigma * 1000``, not integers); ``sigmas`` float32 with N+1 values.
    Note diffusers shifts its end point twice (``sigma_min`` is a shifted value that is shifted again).
    """

    kind: Literal["euler"] = "euler"

    def __init__(self, config: SchedulerConfig, num_inference_steps: int) -> None:
        config.validate()
        self.config = config
        self.num_inference_steps = _check_steps(num_inference_steps)
        self.timesteps, self.sigmas = euler_flow_schedule(
            self.num_inference_steps, float(config.flow_shift), config.num_train_timesteps
        )
        self._dt = (self.sigmas[1:] - self.sigmas[:-1]).astype(np.float32)

    def model_timestep(self, step_index: jax.Array | int) -> jax.Array:
        """The timestep the model is conditioned on at ``step_index`` (float32 scalar, traceable)."""
        return jnp.asarray(self.timesteps, jnp.float32)[step_index]

    def init_state(self, latents: jax.Array) -> EulerState:
        """Initial state for the starting noise ``latents`` (kept in float32)."""
        return EulerState(sample=jnp.asarray(latents, jnp.float32))

    def step(
        self, state: EulerState, model_output: jax.Array, step_index: jax.Array | int
    ) -> tuple[EulerState, jax.Array]:
        """``x + (sigma_{i+1} - sigma_i) * v`` in float32, then cast to ``model_output.dtype`` (as diffusers).

        Returns ``(new_state, prev_sample)``: ``prev_sample`` has ``model_output``'s dtype;
        ``new_state.sample`` holds the same values in float32.
        """
        dt = jnp.asarray(self._dt)[step_index]
        prev = (state.sample + _scalar_times(dt, model_output)).astype(model_output.dtype)
        return EulerState(sample=prev.astype(jnp.float32)), prev


Scheduler = UniPCFlowScheduler | FlowEulerScheduler


def make_scheduler(
    path_or_config: str | Path | dict[str, Any] | SchedulerConfig,
    num_inference_steps: int,
    flow_shift: float | None = None,
    kind: str = "unipc",
) -> Scheduler:
    """Build a scheduler for ``num_inference_steps`` steps.

    ``path_or_config``: a model root dir, its ``scheduler/`` dir, a ``scheduler_config.json`` path, a
    dict or a :class:`SchedulerConfig`. ``flow_shift=None`` keeps the config's shift. ``kind``:
    ``"unipc"``, ``"euler"``, or ``"auto"`` (from the config's ``_class_name``).
    """
    if kind not in SCHEDULER_KINDS:
        raise ConfigError(
            f"scheduler kind={kind!r} is not supported (supported: {', '.join(SCHEDULER_KINDS)})"
        )
    config = load_scheduler_config(path_or_config)
    if flow_shift is not None:
        config = dataclasses.replace(config, flow_shift=flow_shift)
        config.validate("flow_shift override")
    if kind == "auto":
        by_class = {UNIPC_CLASS: "unipc", EULER_CLASS: "euler"}
        if config.class_name not in by_class:
            raise ConfigError(
                f"scheduler _class_name={config.class_name!r} is not supported with kind='auto' "
                f"(supported: {', '.join(by_class)})"
            )
        kind = by_class[config.class_name]
    if kind == "unipc":
        return UniPCFlowScheduler(config, num_inference_steps)
    return FlowEulerScheduler(config, num_inference_steps)
