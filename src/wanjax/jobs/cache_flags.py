"""The step cache's flags (:mod:`wanjax.sampling.cache.step_cache`): the policy and its settings,
MagCache's curve and calibration, TeaCache's coefficients, TaylorSeer's and SeaCache's options."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from wanjax.errors import ConfigError
from wanjax.jobs.flags import library, option

_cache_policies = library("wanjax.sampling.cache.step_cache", "POLICIES")


def _cache_defaults() -> dict[str, Any]:
    from wanjax.sampling.cache import seacache, taylorseer, teacache
    from wanjax.sampling.cache.step_cache import FIRST_BLOCK_THRESHOLD, MAG_DEFAULTS, presets

    return {
        "mag": MAG_DEFAULTS,
        "firstblock": FIRST_BLOCK_THRESHOLD,
        "presets": ", ".join(presets()),
        "tea_presets": ", ".join(teacache.presets()),
        "taylor_options": ", ".join(taylorseer.DEFAULTS),
        "sea_options": ", ".join(seacache.DEFAULTS),
        "sea": seacache.DEFAULTS,
    }


@dataclasses.dataclass(frozen=True)
class CacheFlags:
    """The step cache (:mod:`wanjax.sampling.cache.step_cache`): policy and settings, MagCache's curve,
    and calibration's output file."""

    title: ClassVar[str] = "step cache"
    cache: str = option(
        "off",
        choices=_cache_policies,
        help="skip the DiT's blocks at steps where they barely change (default {default}): magcache (a "
        "magnitude-ratio curve), firstblock (the first block's change), teacache (the timestep "
        "embedding's change), taylorseer (the output extrapolated between full steps; --cache_option) or "
        "seacache (the filtered latents' change; --cache_option)",
    )
    cache_threshold: float | None = option(
        help="skip while the change stays within this (default: the curve's or coefficients' preset, "
        "else magcache {mag[threshold]}, firstblock {firstblock}, seacache {sea[threshold]})",
        values=_cache_defaults,
    )
    cache_max_skip: int | None = option(
        help="magcache: skips in a row at most (default {mag[max_skip_steps]})", values=_cache_defaults
    )
    cache_retention: float | None = option(
        help="magcache: fraction of the first steps that always compute (default {mag[retention_ratio]})",
        values=_cache_defaults,
    )
    mag_ratios: str | None = option(
        metavar="NAME|FILE.json",
        help="magcache's curve: a preset ({presets}; default: this model's) or a JSON list",
        values=_cache_defaults,
    )
    cache_calibrate: str | None = option(
        metavar="FILE.json",
        help="run uncached and write the measured magcache ratios here (per branch; --mag_ratios reads it)",
    )
    teacache_coefficients: str | None = option(
        metavar="NAME|FILE.json",
        help="teacache's rescaling polynomial: a preset ({tea_presets}; default: this model's) or a JSON list",
        values=_cache_defaults,
    )
    cache_option: tuple[str, ...] = option(
        (),
        repeat=True,
        metavar="NAME=VALUE",
        help="taylorseer: one of diffusers' TaylorSeerCacheConfig fields ({taylor_options}); seacache: "
        "one of its SeaCacheConfig fields ({sea_options}); repeatable, e.g. --cache_option "
        "use_lite_mode=true --cache_option cache_interval=3",
        values=_cache_defaults,
    )
    teacache_ret_steps: bool = option(
        False,
        help="teacache: compare the blocks' modulation, 5 warm-up steps, no forced last step (the "
        "authors' use_ret_steps)",
    )

    def config(self) -> Any:
        """The :class:`~wanjax.sampling.cache.step_cache.CacheConfig` (ConfigError naming a bad value);
        ``--cache_calibrate`` runs MagCache's calibration."""
        from wanjax.sampling.cache.step_cache import CacheConfig

        if self.cache_calibrate is not None and self.cache not in ("off", "magcache"):
            raise ConfigError(
                f"--cache_calibrate measures MagCache's ratios; it cannot run with --cache {self.cache}"
            )
        policy = "magcache" if self.cache_calibrate is not None else self.cache
        return CacheConfig(
            policy,
            threshold=self.cache_threshold,
            max_skip_steps=self.cache_max_skip,
            retention_ratio=self.cache_retention,
            mag_ratios=self.mag_ratios,
            calibrate=self.cache_calibrate is not None,
            coefficients=self.teacache_coefficients,
            ret_steps=self.teacache_ret_steps,
            options=cache_options(self.cache_option) or None,
        )


def cache_options(values: tuple[str, ...]) -> dict[str, str]:
    """``--cache_option NAME=VALUE`` values by name (ConfigError for one without ``=``)."""
    out = {}
    for value in values:
        name, sep, text = value.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"--cache_option {value!r} must be NAME=VALUE, e.g. cache_interval=3")
        out[name.strip()] = text.strip()
    return out
