"""``wanjax serve``: a video-generation server over the command line's requests (an optional extra:
``pip install 'wanjax[serve]'``, Starlette and uvicorn)."""
