"""The jobs ``wanjax`` runs, below the command line and the server: a typed request checked against its
model before any work, run, its outputs written atomically and its run recorded.

Each job is a module (:mod:`~wanjax.jobs.generate`, :mod:`~wanjax.jobs.encode`,
:mod:`~wanjax.jobs.denoise`, :mod:`~wanjax.jobs.decode`); ``wanjax <command>`` and ``wanjax serve``
both call them.
"""
