"""Exceptions for user-facing failures: each message names the problem and how to fix it."""


class WanjaxError(Exception):
    """Base class: a problem with the user's inputs or files, reported without a traceback."""


class ConfigError(WanjaxError):
    """A config.json that is missing, malformed, or describes a model wanjax cannot run."""


class CheckpointError(WanjaxError):
    """A model directory whose files or tensors do not match what the config requires."""
