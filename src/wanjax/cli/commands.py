"""The pipeline subcommands: each runs its job (:mod:`wanjax.jobs`) and prints the run's report.

``generate`` runs the three stages in memory; ``encode``, ``denoise`` and ``decode`` run one each and
pass their results through the files of a stage directory (:mod:`wanjax.pipeline.stages`). Both paths
call the same :class:`~wanjax.pipeline.pipeline.WanPipeline` methods on the same values, so they give
the same frames (``info`` and ``plan`` are in :mod:`wanjax.cli.describe`, ``serve`` is
:func:`wanjax.server.serve.serve`).
"""

from __future__ import annotations

from wanjax.jobs.decode import decode
from wanjax.jobs.denoise import denoise
from wanjax.jobs.encode import encode
from wanjax.jobs.generate import generate
from wanjax.jobs.requests import DecodeRequest, DenoiseRequest, EncodeRequest, GenerateRequest
from wanjax.parallel.multihost import is_primary
from wanjax.runtime.timing import RunReport


def show(report: RunReport) -> RunReport:
    """Print the run's report as a table (process 0 only)."""
    if is_primary():
        print(report.table())
    return report


def cmd_generate(request: GenerateRequest) -> RunReport:
    """Prompt to mp4 in one process, refused first when ``plan`` says it cannot fit the memory here."""
    from wanjax.jobs.generate import fits_memory_here

    return show(generate(request, fits_memory_here))


def cmd_encode(request: EncodeRequest) -> RunReport:
    """Stage 1: prompts (and an image) to the stage directory's embeddings."""
    return show(encode(request))


def cmd_denoise(request: DenoiseRequest) -> RunReport:
    """Stage 2: the stage directory's embeddings to its latents."""
    return show(denoise(request))


def cmd_decode(request: DecodeRequest) -> RunReport:
    """Stage 3: the stage directory's latents to mp4."""
    return show(decode(request))
