"""Several processes, one computation: ``jax.distributed`` set-up and process-0-only outputs.

Every process runs the same program on its own devices; the mesh spans all of them. Results are
gathered to every process (``multihost_utils``), and only process 0 writes files.
"""

from __future__ import annotations

import os

import jax

from wanjax.errors import WanjaxError

ENV = ("WANJAX_COORDINATOR_ADDRESS", "WANJAX_NUM_PROCESSES", "WANJAX_PROCESS_ID")


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    environ: dict[str, str] | None = None,
) -> bool:
    """Join a multi-process run when flags or ``WANJAX_COORDINATOR_ADDRESS/_NUM_PROCESSES/_PROCESS_ID``
    ask for one; ``coordinator_address="auto"`` lets JAX detect the cluster (TPU pods, SLURM, ...).
    Returns whether ``jax.distributed`` was initialised. Call before anything touches a device."""
    env = os.environ if environ is None else environ
    values = [coordinator_address, num_processes, process_id]
    for i, name in enumerate(ENV):
        if values[i] is None and env.get(name):
            values[i] = env[name] if i == 0 else _int(env[name], name)
    address, count, pid = values
    if address is None and count is None and pid is None:
        return False
    if address == "auto":
        jax.distributed.initialize()
        return True
    if address is None or count is None or pid is None:
        raise WanjaxError(
            "a multi-process run needs --coordinator_address HOST:PORT, --num_processes N and "
            "--process_id I together (or --coordinator_address auto on a cluster JAX detects)"
        )
    if not 0 <= pid < count:
        raise WanjaxError(f"--process_id {pid} must lie in [0, {count}) for --num_processes {count}")
    jax.distributed.initialize(coordinator_address=address, num_processes=count, process_id=pid)
    return True


def _int(value: str, name: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise WanjaxError(f"${name}={value!r} is not an integer") from None


def is_primary() -> bool:
    """Whether this process writes the outputs (process 0)."""
    return jax.process_index() == 0
