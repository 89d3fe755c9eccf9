"""Scheduler config: parse, validate and load a diffusers ``scheduler_config.json``.

:class:`SchedulerConfig` holds the fields that decide the sampling math; values whose math wanjax does not
implement raise :class:`~wanjax.errors.ConfigError`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from pathlib import Path
from typing import Any

from wanjax.errors import ConfigError

__all__ = ["EULER_CLASS", "IGNORED_FIELDS", "UNIPC_CLASS", "SchedulerConfig", "load_scheduler_config"]

UNIPC_CLASS = "UniPCMultistepScheduler"
EULER_CLASS = "FlowMatchEulerDiscreteScheduler"

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
