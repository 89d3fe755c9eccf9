"""Step caches: each policy's settings, presets and resolution (:mod:`~wanjax.sampling.cache.step_cache`),
the step it runs (:mod:`~wanjax.sampling.cache.forward`), TeaCache's, TaylorSeer's and SeaCache's own
arithmetic, and the published presets beside them (:mod:`~wanjax.sampling.cache.files`)."""
