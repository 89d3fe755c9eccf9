"""The denoising loop: the sampler (:mod:`~wanjax.sampling.sampler`) and what it returns
(:mod:`~wanjax.sampling.results`), the schedulers (:mod:`~wanjax.sampling.scheduler`), the step caches
(:mod:`~wanjax.sampling.cache`) and the text K/V cache (:mod:`~wanjax.sampling.context_cache`).
Below the pipeline, above the models: it runs a transformer's steps and knows nothing of files,
encoders or the VAE."""
