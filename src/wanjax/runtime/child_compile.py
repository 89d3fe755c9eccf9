"""Compile a program in a short-lived child process and load its executable here.

XLA's compiler peaks at a few hundred MiB on a large program (the real VAE decode: ~290 MiB) and
leaves 80-100 MiB of this process's heap behind when it is done: freed pages pinned by the
long-lived objects allocated between them, which ``malloc_trim`` cannot hand back. Tracing and
lowering leave ~20 MiB more. Built in a child, the program arrives as a serialized executable
(:mod:`jax.experimental.serialize_executable`) and only its loaded form stays here.

The child runs the same code on the same inputs (a ``"module:function"`` builder returning the
lowered program and its compiler options, with picklable arguments), with this process's
``sys.path``, environment, CPU device count and the JAX settings that shape a program
(:data:`SHARED_CONFIG`), restricted to the CPU: an accelerator is not shared with a second process (and the compiler's
leftovers there are host memory beside device memory).

The child always compiles afresh, never from JAX's persistent compilation cache: an executable
loaded from that cache serializes without its kernels on the CPU (jax 0.10: running the copy fails
with ``NOT_FOUND: Function ... not found``). Instead, while that cache is on, the serialized
executables are kept beside it (:func:`executable_store`) under a key of everything that makes the
program what it is: the lowered module, its compiler options, the JAX, jaxlib and backend
versions, the devices, ``XLA_FLAGS`` and the host CPU's features (XLA:CPU compiles for them).
A store entry that cannot be read or written costs a compile, never the run; with the cache off
(as it is when its directory cannot be written) there is no store.

Each program built this way is reported through :mod:`jax.monitoring` like JAX's own compiles: a
:data:`COMPILE_EVENT` time span (the child's whole run) and a :data:`STORE_HIT_EVENT` when the
executable came from the store (see :class:`wanjax.runtime.timing.CompileMeter`).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import pickle
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import jaxlib

from wanjax.io.atomic import atomic_path
from wanjax.runtime.jax_cache import is_remote
from wanjax.target import current_target

# JAX settings that change the program a builder makes
SHARED_CONFIG = ("jax_enable_x64", "jax_default_matmul_precision")
COMPILE_EVENT = "/wanjax/child_compile/duration"  # time span: a child building one program
STORE_HIT_EVENT = "/wanjax/child_compile/store_hits"  # ... which it took from the executable store


class ChildCompileError(RuntimeError):
    """The child process could not build the program, or its executable could not be loaded."""


def available() -> bool:
    """Whether programs can be compiled in a child here: one process building for its own CPU."""
    target = current_target()
    return target.platform == "cpu" and not target.compile_only and jax.process_count() == 1


def executable_store() -> Path | None:
    """Where serialized executables are kept: ``<JAX cache dir>-executables`` while JAX's
    persistent compilation cache is on (in a local directory), else nowhere."""
    directory = jax.config.jax_compilation_cache_dir
    if not (jax.config.jax_enable_compilation_cache and directory) or is_remote(directory):
        return None
    directory = Path(directory).expanduser()
    return directory.with_name(directory.name + "-executables")


def compile_in_child(builder: str, *args: Any) -> jax.stages.Compiled:
    """The program ``builder(*args)`` lowers, compiled in a child process (or taken from
    :func:`executable_store`) and loaded here.

    ``builder`` is ``"module:function"`` returning ``(jax.stages.Lowered, compiler options)`` for
    devices this process has; ``args`` must pickle. Raises :class:`ChildCompileError` on failure.
    """
    from jax.experimental.serialize_executable import deserialize_and_load

    start = time.time()
    store = executable_store()
    config = {name: getattr(jax.config, name) for name in SHARED_CONFIG}
    with tempfile.TemporaryDirectory(prefix="wanjax-compile-") as tmp:
        request, result = Path(tmp, "request.pkl"), Path(tmp, "result.pkl")
        request.write_bytes(
            pickle.dumps({"builder": builder, "args": args, "config": config, "store": store})
        )
        env = {
            **os.environ,
            "JAX_PLATFORMS": "cpu",
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
            "XLA_FLAGS": child_xla_flags(os.environ.get("XLA_FLAGS", ""), jax.device_count()),
        }
        try:
            proc = subprocess.run(
                [sys.executable, "-m", __name__, str(request), str(result)],
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                check=False,
            )
        except OSError as err:  # no interpreter to start
            raise ChildCompileError(f"could not start a child process to compile {builder}: {err}") from err
        if proc.returncode or not result.exists():
            lines = [line for line in proc.stderr.splitlines() if line.strip()]
            why = lines[-1] if lines else f"exit status {proc.returncode}"
            raise ChildCompileError(f"compiling {builder} in a child process failed: {why}")
        built = pickle.loads(result.read_bytes())
    try:
        entry = pickle.loads(built["executable"])
        by_id = {d.id: d for d in jax.devices()}
        devices = [by_id[i] for i in entry["devices"]]  # loaded for the devices it was built for
        compiled = deserialize_and_load(*entry["executable"], execution_devices=devices)
    except Exception as err:  # a damaged or foreign executable: compiling anew is the remedy
        raise ChildCompileError(f"loading the executable of {builder} failed: {err}") from err
    jax.monitoring.record_event_time_span(COMPILE_EVENT, start, time.time())
    if built["from_store"]:
        jax.monitoring.record_event(STORE_HIT_EVENT)
    return compiled


DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
STORE_FORMAT = "executable+devices"  # what a store entry holds (part of its key)


def child_xla_flags(flags: str, devices: int) -> str:
    """``flags`` with this process's CPU device count, so the child compiles for the devices the
    program runs on here (whatever ``XLA_FLAGS`` says now: it is read once, when JAX starts)."""
    kept = [f for f in flags.split() if not f.startswith(DEVICE_COUNT_FLAG)]
    return " ".join([*kept, f"{DEVICE_COUNT_FLAG}={devices}"])


def cache_key(lowered: jax.stages.Lowered, options: Mapping[str, Any]) -> str:
    """What the compiled program depends on, hashed (see the module docstring)."""
    devices = jax.devices()
    parts = (
        STORE_FORMAT,
        lowered.as_text(),
        repr(sorted(options.items())),
        jax.__version__,
        jaxlib.__version__,
        devices[0].client.platform_version,
        repr([(d.platform, d.device_kind) for d in devices]),
        os.environ.get("XLA_FLAGS", ""),
        _host_cpu(),
    )
    digest = hashlib.sha256()
    for part in parts:
        digest.update(str(part).encode())
        digest.update(b"\0")
    return digest.hexdigest()


def _host_cpu() -> str:
    """The host CPU's model and feature flags (Linux), else what :mod:`platform` knows."""
    try:
        with open("/proc/cpuinfo") as info:
            lines = [line for line in info if line.startswith(("model name", "flags", "Features"))]
        return "".join(dict.fromkeys(lines))
    except OSError:
        return f"{platform.machine()} {platform.processor()}"


def _child(request_path: str, result_path: str) -> None:
    """The child's side: apply the settings, lower, then compile (or read the store) and write
    the serialized executable."""
    from jax.experimental.serialize_executable import serialize

    request = pickle.loads(Path(request_path).read_bytes())
    for name, value in request["config"].items():
        jax.config.update(name, value)
    jax.config.update("jax_enable_compilation_cache", False)  # see the module docstring
    module, function = request["builder"].split(":")
    lowered, options = getattr(importlib.import_module(module), function)(*request["args"])
    stored = (
        None if request["store"] is None else Path(request["store"], f"{cache_key(lowered, options)}.pkl")
    )
    serialized = None
    if stored is not None:
        with contextlib.suppress(OSError):  # absent or unreadable: compiled anew
            serialized = stored.read_bytes()
    from_store = serialized is not None
    if serialized is None:
        compiled = lowered.compile()
        devices = [d.id for d in compiled.runtime_executable().local_devices()]  # in its assignment's order
        serialized = pickle.dumps({"executable": serialize(compiled), "devices": devices})
        if stored is not None:
            # a read-only or full store: the program is compiled again next time
            with contextlib.suppress(OSError), atomic_path(stored) as tmp:
                tmp.write_bytes(serialized)
    Path(result_path).write_bytes(pickle.dumps({"executable": serialized, "from_store": from_store}))


if __name__ == "__main__":
    _child(*sys.argv[1:3])
