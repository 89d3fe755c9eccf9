"""``wanjax serve``: a video-generation server running the ``generate`` job (:mod:`wanjax.jobs`)
for HTTP clients (an optional extra: ``pip install 'wanjax[serve]'``, Starlette and uvicorn)."""
