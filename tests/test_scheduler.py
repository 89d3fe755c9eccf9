"""Parity of wanjax.sampling.scheduler with diffusers' UniPCMultistepScheduler / FlowMatchEulerDiscreteScheduler.

The synthetic velocity field uses only +, -, *, / (no transcendental functions), so torch and XLA
evaluate it identically and any difference comes from the scheduler arithmetic.
"""

from __future__ import annotations

import itertools
import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

import wanjax.sampling.scheduler.unipc as unipc_module
from wanjax.errors import ConfigError
from wanjax.sampling.scheduler import (
    FlowEulerScheduler,
    SchedulerConfig,
    UniPCFlowScheduler,
    make_scheduler,
)

SHAPE = (2, 16, 3, 4, 6)
STEPS = (1, 2, 10, 50)
SHIFTS = (1.0, 3.0, 5.0)
RTOL = 1e-6


@pytest.fixture(scope="module")
def inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1234)
    x0 = rng.standard_normal(SHAPE).astype(np.float32)
    c = (0.5 * rng.standard_normal(SHAPE)).astype(np.float32)
    return x0, c


def velocity_torch(x: torch.Tensor, t: torch.Tensor, c: np.ndarray) -> torch.Tensor:
    x = x.float()
    return x / (1 + x * x) * (t.float() / 1000) - 0.3 * x + torch.from_numpy(c)


def velocity_jax(x: jax.Array, t: jax.Array, c: np.ndarray) -> jax.Array:
    x = x.astype(jnp.float32)
    return x / (1 + x * x) * (t.astype(jnp.float32) / 1000) - 0.3 * x + c


def ref_unipc(n: int, shift: float, **kwargs) -> UniPCMultistepScheduler:
    sched = UniPCMultistepScheduler(
        prediction_type="flow_prediction",
        use_flow_sigmas=True,
        num_train_timesteps=1000,
        flow_shift=shift,
        **kwargs,
    )
    sched.set_timesteps(n)
    sched.set_begin_index(0)
    return sched


def ref_euler(n: int, shift: float) -> FlowMatchEulerDiscreteScheduler:
    sched = FlowMatchEulerDiscreteScheduler(shift=shift)
    sched.set_timesteps(n)
    sched.set_begin_index(0)
    return sched


def ref_trajectory(
    sched, x0: np.ndarray, c: np.ndarray, dtype=torch.float32, record: list | None = None
) -> list[np.ndarray]:
    """diffusers' denoising loop; returns prev_sample after every step (as float32 numpy).

    ``record``, if given, receives the model output fed at every step (float32 numpy).
    """
    x = torch.from_numpy(x0.copy())
    out = []
    for t in sched.timesteps:
        v = velocity_torch(x, t, c).to(dtype)
        if record is not None:
            record.append(v.float().numpy())
        x = sched.step(v, t, x).prev_sample
        out.append(x.float().numpy())
    return out


def our_trajectory(sched, x0: np.ndarray, c: np.ndarray, dtype=jnp.float32) -> list[np.ndarray]:
    """Step by step, eager, with a Python int step index."""
    state = sched.init_state(jnp.asarray(x0))
    out = []
    for i in range(sched.num_inference_steps):
        v = velocity_jax(state.sample, sched.model_timestep(i), c).astype(dtype)
        state, prev = sched.step(state, v, i)
        np.testing.assert_array_equal(np.asarray(prev.astype(jnp.float32)), np.asarray(state.sample))
        out.append(np.asarray(prev.astype(jnp.float32)))
    return out


def jit_scan_trajectory(sched, x0: np.ndarray, c: np.ndarray, dtype=jnp.float32) -> np.ndarray:
    """The whole loop in one jitted lax.scan with a traced int32 step index; (N, *SHAPE) outputs."""

    @jax.jit
    def run(x):
        def body(state, i):
            v = velocity_jax(state.sample, sched.model_timestep(i), c).astype(dtype)
            state, prev = sched.step(state, v, i)
            return state, prev.astype(jnp.float32)

        steps = jnp.arange(sched.num_inference_steps, dtype=jnp.int32)
        return jax.lax.scan(body, sched.init_state(x), steps)[1]

    return np.asarray(run(jnp.asarray(x0)))


def jit_scan_forced(sched, x0: np.ndarray, outputs: list[np.ndarray], dtype) -> np.ndarray:
    """Jitted lax.scan fed the reference's model outputs (teacher forcing); (N, *SHAPE) outputs."""

    @jax.jit
    def run(x, vs):
        def body(state, inp):
            i, v = inp
            state, prev = sched.step(state, v, i)
            return state, prev.astype(jnp.float32)

        steps = jnp.arange(sched.num_inference_steps, dtype=jnp.int32)
        return jax.lax.scan(body, sched.init_state(x), (steps, vs))[1]

    return np.asarray(run(jnp.asarray(x0), jnp.asarray(np.stack(outputs)).astype(dtype)))


def jit_fori_trajectory(sched, x0: np.ndarray, c: np.ndarray, dtype=jnp.float32) -> np.ndarray:
    """Final sample of a jitted lax.fori_loop (traced step index)."""

    @jax.jit
    def run(x):
        def body(i, state):
            v = velocity_jax(state.sample, sched.model_timestep(i), c).astype(dtype)
            return sched.step(state, v, i)[0]

        return jax.lax.fori_loop(0, sched.num_inference_steps, body, sched.init_state(x)).sample

    return np.asarray(run(jnp.asarray(x0)))


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))


def assert_trajectory_close(ours: list[np.ndarray], ref: list[np.ndarray]) -> None:
    assert len(ours) == len(ref)
    for i, (a, b) in enumerate(zip(ours, ref, strict=True)):
        assert np.isfinite(a).all(), f"step {i}: non-finite output"
        err = rel_err(a, b)
        assert err <= RTOL, f"step {i}: relative error {err:.3e} > {RTOL}"


# ------------------------------------------------------------------------------------------------
# Schedules


@pytest.mark.parametrize("shift", SHIFTS)
@pytest.mark.parametrize("n", STEPS)
def test_unipc_schedule_matches_diffusers(n: int, shift: float) -> None:
    ref = ref_unipc(n, shift)
    ours = make_scheduler(SchedulerConfig(flow_shift=shift), n)
    assert isinstance(ours, UniPCFlowScheduler)
    assert ours.num_inference_steps == n
    assert ours.timesteps.dtype == np.int64
    assert ours.sigmas.dtype == np.float32
    np.testing.assert_array_equal(ours.timesteps, ref.timesteps.numpy())
    np.testing.assert_array_equal(ours.sigmas, ref.sigmas.numpy())


@pytest.mark.parametrize("shift", SHIFTS)
@pytest.mark.parametrize("n", STEPS)
def test_euler_schedule_matches_diffusers(n: int, shift: float) -> None:
    ref = ref_euler(n, shift)
    ours = make_scheduler(SchedulerConfig(flow_shift=shift), n, kind="euler")
    assert isinstance(ours, FlowEulerScheduler)
    assert ours.timesteps.dtype == np.float32
    assert ours.sigmas.dtype == np.float32
    np.testing.assert_array_equal(ours.timesteps, ref.timesteps.numpy())
    np.testing.assert_array_equal(ours.sigmas, ref.sigmas.numpy())


def test_unipc_schedule_wan_values() -> None:
    """Independent anchor: the N=10, shift=3 timesteps listed in WAN_SPEC §5.2."""
    sched = make_scheduler(SchedulerConfig(), 10)
    np.testing.assert_array_equal(sched.timesteps, [999, 964, 923, 875, 818, 750, 667, 563, 429, 251])
    assert sched.sigmas[0] == np.float32(0.999999) and sched.sigmas[-1] == 0


# ------------------------------------------------------------------------------------------------
# UniPC trajectories


@pytest.mark.parametrize("shift", SHIFTS)
@pytest.mark.parametrize("n", STEPS)
def test_unipc_trajectory_matches_diffusers(inputs, n: int, shift: float) -> None:
    x0, c = inputs
    ref = ref_trajectory(ref_unipc(n, shift), x0, c)
    ours = our_trajectory(make_scheduler(SchedulerConfig(flow_shift=shift), n), x0, c)
    assert_trajectory_close(ours, ref)


@pytest.mark.parametrize(("n", "shift"), [(50, 3.0), (2, 5.0), (1, 1.0)])
def test_unipc_trajectory_jit_scan(inputs, n: int, shift: float) -> None:
    x0, c = inputs
    ref = ref_trajectory(ref_unipc(n, shift), x0, c)
    ours = jit_scan_trajectory(make_scheduler(SchedulerConfig(flow_shift=shift), n), x0, c)
    assert_trajectory_close(list(ours), ref)


def test_unipc_trajectory_jit_fori_loop(inputs) -> None:
    x0, c = inputs
    ref = ref_trajectory(ref_unipc(10, 5.0), x0, c)
    ours = jit_fori_trajectory(make_scheduler(SchedulerConfig(flow_shift=5.0), 10), x0, c)
    assert rel_err(ours, ref[-1]) <= RTOL


@pytest.mark.parametrize(("n", "shift"), [(10, 3.0), (50, 5.0), (2, 3.0)])
def test_unipc_bf16_model_output(inputs, n: int, shift: float) -> None:
    """bf16 velocity: diffusers rounds sigma to bf16 and the product sigma*v to bf16 (WAN_SPEC §5.4)."""
    x0, c = inputs
    ref = ref_trajectory(ref_unipc(n, shift), x0, c, dtype=torch.bfloat16)
    ours = our_trajectory(make_scheduler(SchedulerConfig(flow_shift=shift), n), x0, c, dtype=jnp.bfloat16)
    assert_trajectory_close(ours, ref)


@pytest.mark.parametrize(("n", "shift"), [(50, 5.0), (10, 3.0)])
def test_unipc_bf16_model_output_jit(inputs, n: int, shift: float) -> None:
    """Jitted scan fed diffusers' own bf16 model outputs.

    Under jit XLA fuses a*b+c into FMAs, so samples differ from diffusers by ulps; in a closed loop a
    bf16 model output can then round the other way (one bf16 ulp, ~4e-3 on that element), which says
    nothing about the scheduler. Feeding the reference's outputs isolates the scheduler arithmetic.
    """
    x0, c = inputs
    outputs: list[np.ndarray] = []
    ref = ref_trajectory(ref_unipc(n, shift), x0, c, dtype=torch.bfloat16, record=outputs)
    sched = make_scheduler(SchedulerConfig(flow_shift=shift), n)
    ours = jit_scan_forced(sched, x0, outputs, jnp.bfloat16)
    assert_trajectory_close(list(ours), ref)


def test_unipc_bf16_rounding_rule_matters(inputs, monkeypatch) -> None:
    """Guard that the bf16 test is sensitive: rounding only the fp32 product (sigma kept in fp32)
    does not reproduce diffusers."""
    x0, c = inputs
    ref = ref_trajectory(ref_unipc(10, 3.0), x0, c, dtype=torch.bfloat16)

    def fp32_sigma_product(sigma, v):
        return (sigma * v.astype(jnp.float32)).astype(v.dtype).astype(jnp.float32)

    monkeypatch.setattr(unipc_module, "scalar_times", fp32_sigma_product)
    sched = make_scheduler(SchedulerConfig(flow_shift=3.0), 10)
    wrong = our_trajectory(sched, x0, c, dtype=jnp.bfloat16)
    assert rel_err(wrong[-1], ref[-1]) > 10 * RTOL


@pytest.mark.parametrize(("n", "shift"), [(10, 3.0), (50, 5.0)])
def test_unipc_bh1(inputs, n: int, shift: float) -> None:
    x0, c = inputs
    ref_sched = ref_unipc(n, shift, solver_type="bh1")
    ref = ref_trajectory(ref_sched, x0, c)
    ours = our_trajectory(make_scheduler(SchedulerConfig(flow_shift=shift, solver_type="bh1"), n), x0, c)
    assert_trajectory_close(ours[:-1], ref[:-1])
    # diffusers' bh1 final step evaluates (alpha*B_h)*0 with B_h = -inf, which is NaN; the intended
    # value (and wanjax's) is the last x0 prediction, which diffusers keeps in model_outputs[-1].
    final_ref = ref[-1] if np.isfinite(ref[-1]).all() else ref_sched.model_outputs[-1].numpy()
    assert np.isfinite(ours[-1]).all()
    assert rel_err(ours[-1], final_ref) <= RTOL


@pytest.mark.parametrize(
    ("n", "shift", "solver_type"), [(10, 3.0, "bh2"), (50, 5.0, "bh2"), (10, 3.0, "bh1")]
)
def test_unipc_corrector_rhos_match_diffusers(
    inputs, monkeypatch, n: int, shift: float, solver_type: str
) -> None:
    """The order-2 corrector weights (a 2x2 solve, ill-conditioned) are as exact as diffusers' own.

    The trajectory tolerance cannot see small errors in these weights; this checks them directly
    against diffusers run in float64. In float32 they carry ~1e-4 relative error from cancellation
    in the log-SNR differences, and torch's float32 ``log`` differs by a few ulp between CPU code
    paths (bit-equal to ours on Intel MKL, ~1e-4 apart on AMD), so the bar is diffusers' own float32
    error: ours may not be more than 1.5x further from the float64 values than torch's float32 ones.
    """
    x0, c = inputs
    solved: list[np.ndarray] = []
    real_solve = torch.linalg.solve

    def recording_solve(a, b):
        out = real_solve(a, b)
        solved.append(out.numpy().astype(np.float64))
        return out

    monkeypatch.setattr(torch.linalg, "solve", recording_solve)
    ref_trajectory(ref_unipc(n, shift, solver_type=solver_type), x0, c)
    ref32 = np.stack(solved)
    solved.clear()
    exact = ref_unipc(n, shift, solver_type=solver_type)
    exact.sigmas = exact.sigmas.double()
    ref_trajectory(exact, x0.astype(np.float64), c.astype(np.float64), dtype=torch.float64)
    ref64 = np.stack(solved)
    coeffs = make_scheduler(SchedulerConfig(flow_shift=shift, solver_type=solver_type), n).coefficients
    order2 = coeffs["c_rho0"] != 0
    assert len(ref64) == len(ref32) == order2.sum() == n - 2  # steps 2..N-1: order-2 corrections
    ours = np.stack([coeffs["c_rho0"][order2], coeffs["c_rho1"][order2]], axis=1).astype(np.float64)
    torch_err = np.max(np.abs(ref32 - ref64) / np.abs(ref64))
    our_err = np.max(np.abs(ours - ref64) / np.abs(ref64))
    assert torch_err < 1e-3  # the float64 run is the same computation
    assert our_err <= 1.5 * torch_err + 1e-7, (our_err, torch_err)


@pytest.mark.parametrize("n", [2, 10])
def test_unipc_solver_order_1(inputs, n: int) -> None:
    x0, c = inputs
    ref = ref_trajectory(ref_unipc(n, 3.0, solver_order=1), x0, c)
    ours = our_trajectory(make_scheduler(SchedulerConfig(solver_order=1), n), x0, c)
    assert_trajectory_close(ours, ref)


def test_unipc_disable_corrector(inputs) -> None:
    x0, c = inputs
    ref = ref_trajectory(ref_unipc(10, 3.0, disable_corrector=[0, 3, 4]), x0, c)
    ours = our_trajectory(make_scheduler(SchedulerConfig(disable_corrector=(0, 3, 4)), 10), x0, c)
    assert_trajectory_close(ours, ref)
    plain = our_trajectory(make_scheduler(SchedulerConfig(), 10), x0, c)
    assert rel_err(plain[-1], ref[-1]) > 1e-4  # the option has an effect


@pytest.mark.parametrize("n", [1, 2, 10])
def test_unipc_last_step_is_x0_prediction(inputs, n: int) -> None:
    x0, c = inputs
    sched = make_scheduler(SchedulerConfig(), n)
    state = sched.init_state(jnp.asarray(x0))
    for i in range(n):
        v = velocity_jax(state.sample, sched.model_timestep(i), c)
        x_in = np.asarray(state.sample)
        state, prev = sched.step(state, v, i)
    expected = x_in - sched.sigmas[n - 1] * np.asarray(v)
    np.testing.assert_array_equal(np.asarray(prev), expected)
    assert prev.dtype == jnp.float32


# ------------------------------------------------------------------------------------------------
# Euler trajectories


@pytest.mark.parametrize(("n", "shift"), [(1, 3.0), (2, 1.0), (10, 5.0), (50, 3.0), (10, 7.0)])
def test_euler_trajectory_matches_diffusers(inputs, n: int, shift: float) -> None:
    x0, c = inputs
    ref = ref_trajectory(ref_euler(n, shift), x0, c)
    ours = our_trajectory(make_scheduler(SchedulerConfig(flow_shift=shift), n, kind="euler"), x0, c)
    assert_trajectory_close(ours, ref)


def test_euler_trajectory_jit_fori_loop(inputs) -> None:
    x0, c = inputs
    ref = ref_trajectory(ref_euler(10, 3.0), x0, c)
    ours = jit_fori_trajectory(make_scheduler(SchedulerConfig(), 10, kind="euler"), x0, c)
    assert rel_err(ours, ref[-1]) <= RTOL


def test_euler_bf16_model_output(inputs) -> None:
    """diffusers returns latents in the model dtype (bf16) after each Euler step."""
    x0, c = inputs
    ref = ref_trajectory(ref_euler(10, 3.0), x0, c, dtype=torch.bfloat16)
    sched = make_scheduler(SchedulerConfig(), 10, kind="euler")
    ours = our_trajectory(sched, x0, c, dtype=jnp.bfloat16)
    assert_trajectory_close(ours, ref)
    state = sched.init_state(jnp.asarray(x0))
    _, prev = sched.step(state, jnp.zeros(SHAPE, jnp.bfloat16), 0)
    assert prev.dtype == jnp.bfloat16


# ------------------------------------------------------------------------------------------------
# Config parsing


def _save(sched, root) -> None:
    sched.save_pretrained(str(root / "scheduler"))


def test_config_from_save_pretrained(tmp_path) -> None:
    wan = UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, num_train_timesteps=1000, flow_shift=3.0
    )
    _save(wan, tmp_path)
    json_path = tmp_path / "scheduler" / "scheduler_config.json"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every field diffusers writes is known or deliberately ignored
        configs = [SchedulerConfig.from_pretrained(p) for p in (tmp_path, tmp_path / "scheduler", json_path)]
    assert configs[0] == configs[1] == configs[2] == SchedulerConfig()
    assert configs[0].class_name == "UniPCMultistepScheduler"
    assert SchedulerConfig.from_dict(json.loads(json_path.read_text())) == configs[0]
    assert SchedulerConfig.from_dict(configs[0].to_dict()) == configs[0]

    sched = make_scheduler(tmp_path, 10, kind="auto")
    assert isinstance(sched, UniPCFlowScheduler)
    ref = ref_unipc(10, 3.0)
    np.testing.assert_array_equal(sched.timesteps, ref.timesteps.numpy())

    shifted = make_scheduler(str(tmp_path / "scheduler"), 10, flow_shift=5.0)
    np.testing.assert_array_equal(shifted.sigmas, ref_unipc(10, 5.0).sigmas.numpy())
    assert make_scheduler(configs[0], 10).config.flow_shift == 3.0


def test_config_euler_auto(tmp_path) -> None:
    _save(FlowMatchEulerDiscreteScheduler(shift=7.0), tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sched = make_scheduler(tmp_path, 10, kind="auto")
    assert isinstance(sched, FlowEulerScheduler)
    assert sched.config.flow_shift == 7.0
    np.testing.assert_array_equal(sched.timesteps, ref_euler(10, 7.0).timesteps.numpy())
    assert sched.config.to_dict()["shift"] == 7.0
    assert SchedulerConfig.from_dict(sched.config.to_dict()) == sched.config
    # The same config driven by UniPC uses its shift.
    assert isinstance(make_scheduler(tmp_path, 10, kind="unipc"), UniPCFlowScheduler)


def _wan_dict(tmp_path) -> dict:
    _save(
        UniPCMultistepScheduler(
            prediction_type="flow_prediction", use_flow_sigmas=True, num_train_timesteps=1000, flow_shift=3.0
        ),
        tmp_path,
    )
    return json.loads((tmp_path / "scheduler" / "scheduler_config.json").read_text())


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("solver_order", 3),
        ("predict_x0", False),
        ("solver_type", "bh3"),
        ("prediction_type", "epsilon"),
        ("prediction_type", "v_prediction"),
        ("use_flow_sigmas", False),
        ("thresholding", True),
        ("use_karras_sigmas", True),
        ("use_exponential_sigmas", True),
        ("use_beta_sigmas", True),
        ("use_dynamic_shifting", True),
        ("final_sigmas_type", "sigma_min"),
        ("lower_order_final", False),
        ("shift_terminal", 0.1),
        ("flow_shift", -1.0),
        ("num_train_timesteps", 0),
        ("timestep_spacing", "bogus"),
        ("disable_corrector", ["a"]),
        ("invert_sigmas", True),
        ("stochastic_sampling", True),
    ],
)
def test_config_unsupported_values(tmp_path, field: str, value) -> None:
    raw = _wan_dict(tmp_path)
    raw[field] = value
    (tmp_path / "scheduler" / "scheduler_config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError) as excinfo:
        make_scheduler(tmp_path, 10)
    message = str(excinfo.value)
    assert field in message and "\n" not in message


def test_config_lower_order_final_false_with_order_1_is_fine() -> None:
    SchedulerConfig(solver_order=1, lower_order_final=False).validate()


def test_config_missing_keys_take_diffusers_class_defaults() -> None:
    # A UniPC file without prediction_type is an epsilon model for diffusers: rejected.
    with pytest.raises(ConfigError, match="prediction_type"):
        SchedulerConfig.from_dict({"_class_name": "UniPCMultistepScheduler", "use_flow_sigmas": True})
    # A FlowMatchEuler file without shift has shift 1.0.
    cfg = SchedulerConfig.from_dict({"_class_name": "FlowMatchEulerDiscreteScheduler"})
    assert cfg.flow_shift == 1.0
    # Without _class_name the Wan 2.1 defaults apply.
    assert SchedulerConfig.from_dict({"flow_shift": 5.0}) == SchedulerConfig(class_name=None, flow_shift=5.0)


def test_config_unknown_and_ignored_fields() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SchedulerConfig.from_dict({"beta_schedule": "scaled_linear", "variance_type": None, "_foo": 1})
    with pytest.warns(UserWarning, match="brand_new_field"):
        cfg = SchedulerConfig.from_dict({"brand_new_field": 1})
    assert cfg.flow_shift == 3.0


def test_make_scheduler_errors(tmp_path) -> None:
    with pytest.raises(ConfigError, match="kind"):
        make_scheduler(SchedulerConfig(), 10, kind="ddim")
    with pytest.raises(ConfigError, match="num_inference_steps"):
        make_scheduler(SchedulerConfig(), 0)
    with pytest.raises(ConfigError, match="_class_name"):
        make_scheduler({"_class_name": "DDIMScheduler"}, 10, kind="auto")
    with pytest.raises(ConfigError, match="no scheduler config"):
        make_scheduler(tmp_path / "missing", 10)
    (tmp_path / "scheduler_config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        make_scheduler(tmp_path, 10)
    with pytest.raises(ConfigError, match="flow_shift"):
        make_scheduler(SchedulerConfig(), 10, flow_shift=0.0)


@pytest.mark.parametrize("n,shift", [(4, 5.0), (6, 8.0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_distill_steps_equal_diffusers_stochastic_euler(n: int, shift: float, dtype, monkeypatch) -> None:
    """The few-step sampler is diffusers' FlowMatchEulerDiscreteScheduler(stochastic_sampling=True) on
    the grid linspace(1, 0, N+1)[:-1] (LightX2V's [1000, 750, 500, 250] for 4 steps), fed our noise."""
    from diffusers.schedulers import scheduling_flow_match_euler_discrete as reference_module

    ours = make_scheduler(SchedulerConfig(), n, flow_shift=shift, kind="distill", seed=3)
    ref = FlowMatchEulerDiscreteScheduler(shift=shift, stochastic_sampling=True)
    ref.set_timesteps(sigmas=[1 - k / n for k in range(n)])
    np.testing.assert_array_equal(ours.timesteps, ref.timesteps.numpy())
    np.testing.assert_array_equal(ours.sigmas, ref.sigmas.numpy())
    if (n, shift) == (4, 5.0):  # LightX2V's Wan 2.1 4-step table
        np.testing.assert_allclose(ours.timesteps, [1000.0, 937.5, 833.3333, 625.0], rtol=1e-7)
    rng = np.random.default_rng(0)
    latents = rng.standard_normal((1, 16, 2, 4, 4)).astype(np.float32)
    state, sample = ours.init_state(jnp.asarray(latents)), torch.from_numpy(latents)
    draws = []
    for i in range(n):
        velocity = torch.from_numpy(rng.standard_normal(latents.shape).astype(np.float32)).to(dtype)
        noise = np.array(ours.noise(state, i))
        draws.append(noise)
        monkeypatch.setattr(
            reference_module, "randn_tensor", lambda *a, noise=noise, **k: torch.from_numpy(noise)
        )
        sample = ref.step(velocity, ref.timesteps[i], sample).prev_sample
        jax_velocity = jnp.asarray(velocity.float().numpy()).astype(
            jnp.bfloat16 if dtype == torch.bfloat16 else jnp.float32
        )
        state, prev = ours.step(state, jax_velocity, i)
        np.testing.assert_array_equal(np.asarray(prev, np.float32), sample.float().numpy())
    assert all(np.abs(a - b).max() > 0.1 for a, b in itertools.pairwise(draws))  # fresh noise each step
    again = make_scheduler(SchedulerConfig(), n, flow_shift=shift, kind="distill", seed=4)
    assert np.abs(np.asarray(again.noise(again.init_state(jnp.asarray(latents)), 0)) - draws[0]).max() > 0.1
