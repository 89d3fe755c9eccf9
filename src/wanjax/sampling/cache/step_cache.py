"""Step caching: skip the transformer's blocks at steps where their output barely changes.

Five policies, four decision for decision as diffusers' hooks (0.42: ``hooks/mag_cache.py``,
``hooks/first_block_cache.py``, ``hooks/taylorseer_cache.py``, ``hooks/sea_cache.py``), TeaCache as its
authors' Wan 2.1 code; each CFG branch (``cond``, ``uncond``) with its own state as diffusers'
``cache_context("cond" / "uncond")`` keeps it, one decision per branch for its whole batch:

* **MagCache** (``magcache``): a calibrated curve of per-step magnitude ratios of the blocks'
  residual. From step ``int(retention_ratio * N + 0.5)`` on, each step multiplies the running ratio
  by the curve's value and adds ``|1 - ratio|`` to the running error; the step skips while that error
  is ``<= threshold`` and at most ``max_skip_steps`` steps in a row have accumulated, else it
  computes and the three restart. A skip returns the blocks' input plus the residual (last block's
  output minus first block's input) cached at the last computed step. The decisions depend on the
  curve only, so the whole schedule is computed on the host before the loop (:func:`mag_schedule`,
  in float32 as the hook's tensors).
* **First-Block Cache** (``firstblock``): the first block always runs; the rest are skipped when its
  residual changed little since the last computed step: ``mean|r - r_ref| / mean|r_ref| <= threshold``
  (``r_ref``: the first block's residual at the last step that ran every block; the first step always
  computes). A skip returns the first block's output plus the cached residual of the others. The
  decision is data: it is taken on the device (``lax.cond``), with no host round-trip.

* **TeaCache** (``teacache``): the rescaled change of the step's timestep embedding, accumulated;
  a schedule computed on the host before the loop, one for both branches, a skip taking MagCache's
  path (:mod:`wanjax.sampling.cache.teacache`).
* **TaylorSeer** (``taylorseer``): a step-index schedule; a computed step runs the whole forward and
  updates the Taylor factors of its output, a predicted one returns their extrapolation and runs
  nothing else (:mod:`wanjax.sampling.cache.taylorseer`).
* **SeaCache** (``seacache``): the accumulated change of a spectrally filtered view of the noisy
  latents; decided on the device, a skip adding the last residual or its linear extrapolation
  (:mod:`wanjax.sampling.cache.seacache`).

Both branches run batched in one forward whenever either computes; a branch that decided to skip
takes its cached output then too (its result is exactly the skip's, the compute spent on it is thrown
away); when no branch computes, the blocks do not run. Under a mesh the decision is one global value
(the means span every device's rows), so all devices take the same branch.

A two-expert model (Wan 2.2 A14B) keeps a cache per expert, as diffusers with a hook on each
transformer: each expert's turn starts from an empty cache (its first step computes); MagCache
schedules each turn from its slice of one curve over the run (:func:`resolve`).

An Animate model takes TaylorSeer alone (:data:`ANIMATE_POLICIES`, the one hook diffusers can put on
it), its state carried from one segment to the next (:class:`CacheCarry`), as diffusers' pipeline
never resets the hook between them.

The patch embedding, the condition embedders and the output norm and projection run at every step,
as in diffusers, whose hooks wrap only the block list. Calibration (``calibrate=True``, MagCache)
never skips and measures, per branch and step, the mean over tokens of ``||r_t|| / (||r_{t-1}|| +
1e-8)`` of the blocks' residual (1.0 at the first step), the curve a later run reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from wanjax.errors import ConfigError
from wanjax.models.config import TransformerConfig
from wanjax.models.registry import match
from wanjax.sampling.cache import seacache, taylorseer, teacache
from wanjax.sampling.cache.files import number_list, packaged_presets, read_json_file

POLICIES: tuple[str, ...] = ("off", "magcache", "firstblock", "teacache", "taylorseer", "seacache")
BRANCHES: tuple[str, ...] = ("cond", "uncond")  # the rows of a guided batch: [cond; uncond]
# diffusers' MagCacheConfig and FirstBlockCacheConfig defaults
MAG_DEFAULTS = {"threshold": 0.06, "max_skip_steps": 3, "retention_ratio": 0.2}
FIRST_BLOCK_THRESHOLD = 0.05
PRESETS_FILE = "mag_ratios.json"
# On an Animate model, the policies diffusers 0.42.1 runs: ``enable_cache`` puts MagCache's, First-Block
# Cache's and SeaCache's hooks on the blocks through ``TransformerBlockRegistry``, which registers
# ``transformer_wan.WanTransformerBlock`` but not ``transformer_wan_animate.py``'s copy of it, so it
# raises "Model class ... not registered" there; TaylorSeer's hook matches modules by name and runs.
ANIMATE_POLICIES: tuple[str, ...] = ("taylorseer",)
_NO_ANIMATE_HOOK = (
    "diffusers (0.42.1) cannot put its {} hook on an Animate transformer (its block class is missing from "
    "diffusers' block registry), so there is no reference to match: use --cache taylorseer or leave the "
    "cache off"
)
ANIMATE_REFUSALS: dict[str, str] = {
    **{
        p: f"{p} does not run on an Animate model: " + _NO_ANIMATE_HOOK.format(p)
        for p in ("magcache", "firstblock", "seacache")
    },
    "teacache": (
        "teacache does not run on an Animate model: its coefficients are fitted for Wan 2.1's text and "
        "image to video and diffusers has no TeaCache hook to check one on Animate against: use --cache "
        "taylorseer or leave the cache off"
    ),
}

Curve = Sequence[float] | Mapping[str, Sequence[float]]


@dataclasses.dataclass(frozen=True)
class CacheConfig:
    """A step-cache policy (``off | magcache | firstblock | teacache``) and its settings; None: the
    default (a MagCache preset's published settings, else diffusers' defaults: threshold 0.06, 3 steps,
    retention 0.2; First-Block Cache threshold 0.05; TeaCache: its coefficients' published threshold).

    ``mag_ratios``: a preset name (:func:`presets`), a JSON file (a list of floats, or
    ``{"cond": [...], "uncond": [...]}`` as calibration writes it), a list (both branches, as
    diffusers), or a mapping of per-branch lists; None: the preset of this model's architecture, if
    one is published. ``calibrate``: MagCache only; run uncached and measure the ratios.

    ``coefficients`` (TeaCache, :mod:`wanjax.sampling.cache.teacache`): a preset name, a JSON file holding
    a list, or a list (highest power first); None: the preset of this model's architecture.
    ``ret_steps``: the authors' ``use_ret_steps`` mode (the blocks' modulation as the compared input,
    five warm-up steps, no forced last step).

    ``options`` (TaylorSeer, :mod:`wanjax.sampling.cache.taylorseer`; SeaCache,
    :mod:`wanjax.sampling.cache.seacache`): diffusers' ``TaylorSeerCacheConfig`` / ``SeaCacheConfig`` fields
    by name, over its defaults (SeaCache's ``threshold`` also as ``threshold``).
    """

    policy: str = "off"
    threshold: float | None = None
    max_skip_steps: int | None = None
    retention_ratio: float | None = None
    mag_ratios: str | Path | Curve | None = None
    calibrate: bool = False
    coefficients: str | Path | Sequence[float] | None = None
    ret_steps: bool = False
    options: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ConfigError(f"unknown cache policy {self.policy!r}; use one of {', '.join(POLICIES)}")
        if self.threshold is not None and not self.threshold >= 0:
            raise ConfigError(f"cache threshold must be >= 0, got {self.threshold}")
        if self.max_skip_steps is not None and self.max_skip_steps < 0:
            raise ConfigError(f"cache max_skip_steps must be >= 0, got {self.max_skip_steps}")
        if self.retention_ratio is not None and not 0 <= self.retention_ratio <= 1:
            raise ConfigError(f"cache retention_ratio must lie in [0, 1], got {self.retention_ratio}")
        magcache_only = {
            "max_skip_steps": self.max_skip_steps,
            "retention_ratio": self.retention_ratio,
            "mag_ratios": self.mag_ratios,
        }
        if self.calibrate:
            magcache_only["calibrate"] = True
        teacache_only = {"coefficients": self.coefficients, "ret_steps": True if self.ret_steps else None}
        only = (
            ("magcache", magcache_only),
            ("teacache", teacache_only),
            (("taylorseer", "seacache"), {"options": self.options}),
        )
        for policies, fields in only:
            policies = (policies,) if isinstance(policies, str) else policies
            policy = " or ".join(policies)
            given = [name for name, value in fields.items() if value is not None]
            if self.policy not in policies and given:
                verb = "is" if len(given) == 1 else "are"
                raise ConfigError(f"{', '.join(given)} {verb} for the {policy} policy, not {self.policy!r}")
        if self.policy == "taylorseer":
            if self.threshold is not None:
                raise ConfigError("taylorseer has no threshold: its steps are set by its options")
            taylorseer.settings(self.options)
        if self.policy == "seacache":
            seacache.settings(self.options, self.threshold)

    @property
    def enabled(self) -> bool:
        return self.policy != "off"


# ----------------------------------------------------------------------------------------------
# MagCache curves


def presets() -> dict[str, dict[str, Any]]:
    """The published MagCache curves by name (``wan2.1-t2v-1.3b``, ...): each with its ``ratios``
    (interleaved cond/uncond, as the MagCache authors publish them), their recommended
    ``threshold``, ``max_skip_steps``, ``retention_ratio``, and the ``source`` (repository, file,
    line, commit) they were copied from."""
    return packaged_presets(PRESETS_FILE)


def preset_for(cfg: TransformerConfig, two_experts: bool = False, first_frame: bool = False) -> str | None:
    """The curve published for this transformer's registry variant (:func:`wanjax.models.registry.match`;
    TI2V's depends on whether an image is its ``first_frame``; a two-expert model's one curve spans
    both experts), or None."""
    found = match(cfg, 2 if two_experts else 1)
    return None if found is None else found.mag_curve(first_frame)


def _branch_curves(ratios: Any, where: str) -> dict[str, list[float]]:
    """Per-branch curves of a list (both branches) or a ``{"cond", "uncond"}`` mapping."""
    if isinstance(ratios, Mapping):
        unknown = set(ratios) - set(BRANCHES)
        if unknown or "cond" not in ratios:
            raise ConfigError(
                f"{where}: per-branch ratios need a 'cond' list (and may have 'uncond'), got {sorted(ratios)}"
            )
        curves = {name: ratios[name] for name in BRANCHES if name in ratios}
        curves.setdefault("uncond", curves["cond"])
    else:
        curves = {name: ratios for name in BRANCHES}
    return {name: number_list(curve, where, "ratios") for name, curve in curves.items()}


@dataclasses.dataclass(frozen=True)
class MagCurves:
    """Per-branch ratio curves and the settings that came with them (a preset's; else None)."""

    curves: dict[str, list[float]]
    source: str
    threshold: float | None = None
    max_skip_steps: int | None = None
    retention_ratio: float | None = None


def read_mag_ratios(
    value: str | Path | Curve | None,
    cfg: TransformerConfig | None = None,
    two_experts: bool = False,
    first_frame: bool = False,
) -> MagCurves:
    """``value`` (see :class:`CacheConfig`'s ``mag_ratios``) as per-branch curves (None: ``cfg``'s
    preset, see :func:`preset_for`); ConfigError for an unknown name, an unreadable file or a
    malformed list."""
    if value is None:
        name = None if cfg is None else preset_for(cfg, two_experts, first_frame)
        if name is None:
            raise ConfigError(
                "magcache needs a ratio curve: no published curve matches this model; pass --mag_ratios "
                f"NAME|FILE.json (presets: {', '.join(presets())}) or measure one with --cache_calibrate FILE.json"
            )
        value = name
    if isinstance(value, str | Path) and str(value) in presets():
        entry = presets()[str(value)]
        ratios = entry["ratios"]
        curves = {"cond": ratios[0::2], "uncond": ratios[1::2]}  # the authors' interleaved layout
        return MagCurves(
            _branch_curves(curves, str(value)),
            f"preset {value} ({entry['source']})",
            entry["threshold"],
            entry["max_skip_steps"],
            entry["retention_ratio"],
        )
    if isinstance(value, str | Path):
        data = read_json_file(value, presets(), "MagCache", "ratios", "a list of floats")
        return MagCurves(_branch_curves(data, str(Path(value))), f"file {Path(value)}")
    return MagCurves(_branch_curves(value, "mag_ratios"), "given")


def nearest_interp(curve: Sequence[float], length: int) -> np.ndarray:
    """``curve`` resampled to ``length`` entries by nearest index, as diffusers' ``nearest_interp``
    (float32 positions, rounded half to even); a curve of that length is returned as it is."""
    src = np.asarray(curve, np.float32)
    if len(src) == length:
        return src
    if length == 1:
        return src[-1:]
    scale = np.float32((len(src) - 1) / (length - 1))
    indices = np.round(np.arange(length, dtype=np.float32) * scale).astype(np.int64)
    return src[indices]


def mag_schedule(
    curve: Sequence[float], num_steps: int, threshold: float, max_skip_steps: int, retention_ratio: float
) -> np.ndarray:
    """Which of ``num_steps`` steps compute (``bool [num_steps]``) for one branch: diffusers'
    ``MagCacheHeadHook`` decisions (its float32 arithmetic) for the ``curve`` resampled to the steps."""
    ratios = nearest_interp(curve, num_steps)
    limit = np.float32(threshold)
    retention = int(retention_ratio * num_steps + 0.5)
    compute = np.ones(num_steps, bool)
    ratio, error, steps = np.float32(1), np.float32(0), 0
    have_residual = False
    for step in range(num_steps):
        if step >= retention:
            ratio = np.float32(ratio * ratios[step])
            steps += 1
            error = np.float32(error + abs(np.float32(1) - ratio))
            if have_residual and error <= limit and steps <= max_skip_steps:
                compute[step] = False
            else:
                ratio, error, steps = np.float32(1), np.float32(0), 0
        have_residual = have_residual or bool(compute[step])
    return compute


# ----------------------------------------------------------------------------------------------
# A policy resolved for one run


@dataclasses.dataclass(frozen=True)
class StepCache:
    """A :class:`CacheConfig` resolved for one run: the policy's settings and the steps each branch
    may compute, ``schedule [num_steps, branches]`` (MagCache: its decisions, with the curves they
    come from; First-Block Cache: all, the data decides)."""

    policy: str
    branches: tuple[str, ...]
    threshold: float
    schedule: np.ndarray
    max_skip_steps: int | None = None
    retention_ratio: float | None = None
    calibrate: bool = False
    source: str | None = None
    curves: dict[str, list[float]] | None = None
    ret_steps: bool = False
    taylor: taylorseer.TaylorSeerSettings | None = None
    sea: seacache.SeaCacheSettings | None = None
    sea_scalars: np.ndarray | None = None  # SeaCache: per step (s, s^2, n^2), seacache.step_scalars

    @property
    def key(self) -> tuple[Any, ...]:
        """What the step program depends on (the numbers are its arguments; SeaCache's per-step
        scalars come from the scheduler, part of the program's key)."""
        return self.policy, self.calibrate, self.taylor, self.sea

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"policy": self.policy, "threshold": self.threshold}
        if self.policy == "magcache":
            out.update(
                max_skip_steps=self.max_skip_steps,
                retention_ratio=self.retention_ratio,
                mag_ratios=self.source,
                calibrate=self.calibrate,
            )
        if self.policy == "teacache":
            out.update(coefficients=self.source, ret_steps=self.ret_steps)
        if self.taylor is not None:
            del out["threshold"]
            out["options"] = self.taylor.as_json()
        if self.sea is not None:
            out["options"] = self.sea.as_json()
        return out


def resolve(
    config: CacheConfig,
    cfg: TransformerConfig,
    num_steps: int,
    guided: bool,
    experts: Sequence[int] | None = None,
    first_frame: bool = False,
    time_inputs: Callable[[bool], np.ndarray] | None = None,
    sigmas: np.ndarray | None = None,
    calls_before: int = 0,
) -> StepCache | None:
    """``config`` for a run of ``num_steps`` steps, guided (two branches) or not; None when off.
    ``first_frame``: an image conditions the run as its first latent frame (TI2V; it picks the curve).

    ``experts``: a two-expert model's expert of each step (None: one transformer). MagCache then runs
    per expert, as diffusers with a ``MagCacheConfig`` on each transformer: the curve (one spanning
    the whole run, as the MagCache authors publish Wan 2.2 A14B's) resampled to the steps, then each
    expert's steps scheduled from its slice alone, with its own retention and from an empty cache.

    ``time_inputs(ret_steps)``: TeaCache's modulated input of each step (``[num_steps, ...]``, see
    :mod:`wanjax.sampling.cache.teacache`); None: every step computes (a program lowered for its shapes).
    ``sigmas``: the scheduler's, which SeaCache's filter reads (None: ones, for shapes only).
    ``calls_before``: TaylorSeer only, the calls its hook counted in earlier runs whose state this one
    continues (:class:`CacheCarry`; an Animate model's earlier segments).

    On an Animate model only TaylorSeer runs (:data:`ANIMATE_REFUSALS` says why not the others)."""
    if not config.enabled:
        return None
    if cfg.animate and config.policy not in ANIMATE_POLICIES:
        raise ConfigError(ANIMATE_REFUSALS[config.policy])
    if calls_before and (config.policy != "taylorseer" or experts is not None):
        raise ValueError("only taylorseer on one transformer continues a previous run's state")
    branches = BRANCHES if guided else BRANCHES[:1]
    if config.policy == "teacache":
        return _resolve_teacache(config, cfg, num_steps, branches, experts, time_inputs)
    if config.policy == "taylorseer":  # each expert's hook counts its own calls from 0
        found = taylorseer.settings(config.options)
        segments = expert_segments(experts) if experts is not None else [(0, num_steps)]
        whole = [taylorseer.schedule(calls_before + b - a, found)[calls_before:] for a, b in segments]
        compute = np.concatenate(whole)
        schedule = np.repeat(compute[:, None], len(branches), axis=1)
        return StepCache("taylorseer", branches, 0.0, schedule, taylor=found)
    if config.policy == "seacache":  # every step may compute: the latents' filtered change decides
        if cfg.in_channels != cfg.out_channels or cfg.vace or first_frame:
            raise ConfigError(
                "seacache runs where diffusers' runs it, on text-to-video runs (its image-to-video and "
                "VACE pipelines give the hook no step, so it computes every step there): use --cache "
                "magcache, firstblock or teacache"
            )
        sea = seacache.settings(config.options, config.threshold)
        sigmas = np.ones(num_steps + 1, np.float32) if sigmas is None else sigmas
        schedule = np.ones((num_steps, len(branches)), bool)
        scalars = seacache.step_scalars(sigmas, num_steps)
        return StepCache("seacache", branches, sea.threshold, schedule, sea=sea, sea_scalars=scalars)
    if config.policy == "firstblock":  # every step may compute: the first block's change decides
        threshold = FIRST_BLOCK_THRESHOLD if config.threshold is None else config.threshold
        schedule = np.ones((num_steps, len(branches)), bool)
        return StepCache("firstblock", branches, float(threshold), schedule)
    if config.calibrate:  # every step computes
        schedule = np.ones((num_steps, len(branches)), bool)
        return StepCache("magcache", branches, 0.0, schedule, calibrate=True, source="calibration")
    mag = read_mag_ratios(config.mag_ratios, cfg, experts is not None, first_frame)

    def pick(name: str) -> Any:
        given = getattr(config, name)
        published = getattr(mag, name)
        return given if given is not None else published if published is not None else MAG_DEFAULTS[name]

    threshold, max_skip, retention = pick("threshold"), pick("max_skip_steps"), pick("retention_ratio")

    def branch_schedule(curve: Sequence[float]) -> np.ndarray:
        if experts is None:
            return mag_schedule(curve, num_steps, threshold, max_skip, retention)
        resampled, bounds = nearest_interp(curve, num_steps), expert_segments(experts)
        return np.concatenate(
            [mag_schedule(resampled[a:b], b - a, threshold, max_skip, retention) for a, b in bounds]
        )

    schedule = np.stack([branch_schedule(mag.curves[b]) for b in branches], axis=1)
    return StepCache(
        "magcache",
        branches,
        float(threshold),
        schedule,
        int(max_skip),
        float(retention),
        source=mag.source,
        curves={b: mag.curves[b] for b in branches},
    )


def _resolve_teacache(
    config: CacheConfig,
    cfg: TransformerConfig,
    num_steps: int,
    branches: tuple[str, ...],
    experts: Sequence[int] | None,
    time_inputs: Callable[[bool], np.ndarray] | None,
) -> StepCache:
    """TeaCache's one schedule for every branch (:func:`wanjax.sampling.cache.teacache.tea_schedule`)."""
    if experts is not None:
        raise ConfigError(
            "teacache's coefficients are fitted for one transformer (Wan 2.1); for a two-expert model "
            "use --cache magcache or firstblock"
        )
    tea = teacache.read_coefficients(config.coefficients, cfg, config.ret_steps)
    threshold = config.threshold if config.threshold is not None else tea.threshold
    if threshold is None:
        raise ConfigError("teacache with coefficients of your own needs a threshold (--cache_threshold)")
    compute = np.ones(num_steps, bool)
    if time_inputs is not None:
        compute = teacache.tea_schedule(
            time_inputs(config.ret_steps), tea.coefficients, threshold, config.ret_steps
        )
    schedule = np.repeat(compute[:, None], len(branches), axis=1)
    return StepCache(
        "teacache", branches, float(threshold), schedule, source=tea.source, ret_steps=config.ret_steps
    )


def expert_segments(experts: Sequence[int]) -> list[tuple[int, int]]:
    """The ``[start, stop)`` step ranges of each expert's turn in a schedule like ``[0, 0, 1, 1]``."""
    starts = [i for i in range(len(experts)) if i == 0 or experts[i] != experts[i - 1]]
    return list(zip(starts, [*starts[1:], len(experts)], strict=True))


@dataclasses.dataclass(frozen=True)
class CacheCarry:
    """A TaylorSeer cache's state at the end of a run, for a next run to continue from as diffusers'
    hook does when nothing resets it between denoising loops (``WanAnimatePipeline``'s segments, 0.42.1
    ``pipeline_wan_animate.py`` 1037-1188): its factors, their valid orders, the last computed step
    counted from the next run's first (-1: the run's last step), and the calls the hook counted."""

    state: dict[str, Any]
    calls: int


@dataclasses.dataclass
class CacheReport:
    """Per branch, which steps computed the blocks; the forwards actually run; calibration's ratios."""

    cache: StepCache
    computed: dict[str, list[bool]]
    ratios: dict[str, list[float]] | None = None
    seconds_saved: float | None = None

    @property
    def evaluations(self) -> int:
        """Branch evaluations of the blocks actually run (a step where any branch computes runs all)."""
        steps = zip(*self.computed.values(), strict=True)
        return sum(len(self.computed) for step in steps if any(step))

    @classmethod
    def joined(cls, reports: Sequence[CacheReport]) -> CacheReport:
        """Consecutive runs' reports as one (an Animate model's segments): their steps in turn."""
        computed = {name: [c for r in reports for c in r.computed[name]] for name in reports[0].computed}
        saved = [r.seconds_saved for r in reports if r.seconds_saved is not None]
        return cls(reports[-1].cache, computed, None, sum(saved) if saved else None)

    def as_json(self) -> dict[str, Any]:
        branches = {
            name: {
                "evaluated_steps": sum(flags),
                "skipped_steps": len(flags) - sum(flags),
                "skipped": [i for i, computed in enumerate(flags) if not computed],
            }
            for name, flags in self.computed.items()
        }
        out = {**self.cache.describe(), "branches": branches, "dit_evaluations": self.evaluations}
        out["seconds_saved"] = None if self.seconds_saved is None else round(self.seconds_saved, 3)
        if self.ratios is not None:
            out["ratios"] = self.ratios
        return out
