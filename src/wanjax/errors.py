"""Exceptions for user-facing failures: each message names the problem and how to fix it.

The command line prints them as one line (``--debug`` shows the traceback) and exits with the
class's ``exit_code``: 2 for mistakes in the user's inputs (flags, model directories, stage files),
1 for failures while running (a run that diverged to NaN/inf, an output that could not be written, a
full disk).
"""


class WanjaxError(Exception):
    """Base class: a problem with the user's inputs or files, reported without a traceback."""

    exit_code = 2


class FlagError(WanjaxError):
    """A problem with one flag's value, or its absence: ``flag`` names it without its dashes (the
    server's ``param``, the field it stands for)."""

    def __init__(self, message: str, flag: str | None = None) -> None:
        super().__init__(message)
        self.flag = flag


class ConfigError(WanjaxError):
    """A config.json that is missing, malformed, or describes a model wanjax cannot run."""


class CheckpointError(WanjaxError):
    """A model directory whose files or tensors do not match what the config requires."""


class RuntimeFailure(WanjaxError):
    """A run that started on valid inputs but failed while working (exit code 1)."""

    exit_code = 1


class DiskFull(RuntimeFailure, OSError):
    """An output that could not be written for want of space (its ``errno`` ENOSPC or EDQUOT): still
    an OSError to whoever catches one (a cache write that may fail quietly)."""


class NumericalError(RuntimeFailure):
    """NaN or infinite values in latents (after a denoising step, or in a stage file)."""


def parse_json_object(text: str | bytes, where: str, error: type[WanjaxError] = WanjaxError) -> dict:
    """``text`` parsed as a JSON object; ``error`` (``"{where}: ..."``, one line) when it is not one."""
    import json

    try:
        value = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise error(f"{where}: not valid JSON") from None
    if not isinstance(value, dict):
        raise error(f"{where}: not a JSON object")
    return value


def one_line(message: object) -> str:
    """The message on one line (multi-line messages are joined)."""
    return " ".join(line.strip() for line in str(message).splitlines() if line.strip())
