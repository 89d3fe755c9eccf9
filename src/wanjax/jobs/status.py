"""Status lines while a run works, on stderr: the header first, a line as each stage starts (with the
time since the start), the denoising steps (and on a terminal the decoded latent frames) counted with
an ETA, and a word while a stage is silent (a first step that compiles its program takes minutes on a
large video). On a terminal the counts and that word are rewritten in place every second. Piped, they
are whole lines, a count at most every :data:`LINE_EVERY` seconds and a word after :data:`QUIET_AFTER`
seconds of silence, held back until the run has taken :data:`LOG_AFTER` seconds: a quick run (or one
that fails at once) prints its table (or its error) alone. ``--quiet``: nothing."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Literal, TextIO

# What each stage of :func:`wanjax.jobs.generate.run_generate` does, as its line says it
STAGE_WORK = {
    "encode": "the text encoder (loaded and compiled on first use)",
    "denoise": "the transformer",
    "decode": "the VAE decoder (loaded and compiled on first use)",
    "write": "the outputs",
    "clip": "a clip of the long video: its prompt's encoding, its steps and its decode",
}


# What each step of the ``encode`` job does
ENCODE_WORK = {
    "encode": "the text encoder (loaded and compiled on first use)",
    "image": "the image's conditioning: the image encoder and the VAE encoder",
    "video": "the video to re-make: the VAE encoder",
    "vace": "the VACE control (video, mask, reference images): the VAE encoder",
    "animate": "an Animate model's inputs: the videos prepared, the character's image encoder and VAE encoder",
    "write": "the stage files",
}

LOG_AFTER = 30.0  # piped: seconds a run's lines are held back (then written, and every later one)
LINE_EVERY = 30.0  # piped: seconds between two count lines of a stage (its first and last units always)
QUIET_AFTER = 60.0  # piped: seconds of silence before a line says the stage still works
TICK = 1.0  # on a terminal: seconds between two rewrites of a silent stage's line

Mode = Literal["terminal", "lines"]


def headline(model: str, batch: int, video: dict, steps: int | None = None) -> str:
    """What a run makes, in one line: the model, the videos (``video``'s frames, width and height)
    and the denoising steps."""
    videos = f"{batch} video{'s' if batch > 1 else ''} of {video['frames']} frames {video['width']}x{video['height']}"
    return f"model {model}, {videos}" + (f", {steps} steps" if steps else "")


class Status:
    """``status(stage, done)``: the ``on_progress`` of a run (see :func:`~wanjax.jobs.generate.run_generate`);
    ``steps`` is the denoising steps' count, ``frames`` the latent frames the decode reports as it goes
    (0: it does not), ``work`` what each stage does (default :data:`STAGE_WORK`; a stage ``"clip 2/3"``
    reads ``"clip"``'s). ``mode``: ``"terminal"`` (counts in place), ``"lines"`` (whole lines) or None
    (nothing). ``tick``: seconds between looks for a silent stage (None: never look), in a thread that
    runs while the status is entered as a context manager. ``hold``: seconds from the start during which
    lines are held back (written with the first one after them; dropped if the run ends sooner).
    ``counts``: whether the stages report their units (a benchmark's do not).

    An ETA counts from the end of a stage's warm-up, the units whose time includes a compile: the first
    step, and the decode's first latent frame and first part when it decodes its first frame alone."""

    def __init__(
        self,
        command: str,
        steps: int,
        stream: TextIO | None = None,
        mode: Mode | None = "terminal",
        clock: Callable[[], float] = time.perf_counter,
        work: Mapping[str, str] = STAGE_WORK,
        frames: int = 0,
        tick: float | None = None,
        hold: float = 0.0,
        counts: bool = True,
    ):
        self.command, self.steps, self.stream, self.mode = command, steps, stream or sys.stderr, mode
        self.work, self.tick, self.hold = work, tick, hold
        self.held: list[str] = []  # lines written before ``hold`` seconds passed
        self.counted = {"denoise": (steps, "step"), "decode": (frames, "latent frame")} if counts else {}
        self.clock, self.start = clock, clock()
        self.stage: str | None = None
        self.done = 0
        self.warm: tuple[float, int] | None = None  # (time, units) as the stage's warm-up ended
        self.reports = 0  # the stage's counted reports so far
        self.warmup = 1  # the reports whose time includes a compile
        self.written = self.start  # when a line was last written
        self.open_line: Literal["count", "word"] | None = None  # the in-place line left open
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def for_terminal(
        cls,
        command: str,
        steps: int,
        quiet: bool,
        work: Mapping[str, str] = STAGE_WORK,
        frames: int = 0,
        counts: bool = True,
    ) -> Status:
        """In place when stderr is a terminal, whole lines when it is not; silent when ``quiet`` and
        beyond process 0."""
        from wanjax.parallel.multihost import is_primary

        mode: Mode | None = (
            None if quiet or not is_primary() else "terminal" if sys.stderr.isatty() else "lines"
        )
        tick, hold = (TICK, 0.0) if mode == "terminal" else (QUIET_AFTER, LOG_AFTER)
        return cls(command, steps, mode=mode, work=work, frames=frames, tick=tick, hold=hold, counts=counts)

    @property
    def enabled(self) -> bool:
        return self.mode is not None

    @property
    def in_place(self) -> bool:
        """Counts rewritten in place (a terminal): worth the decode's parts (it counts its latent frames)."""
        return self.mode == "terminal"

    def __enter__(self) -> Status:
        if self.enabled and self.tick is not None:
            self._thread = threading.Thread(target=self._watch, name="wanjax-status", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.close()

    def header(self, text: str) -> None:
        with self._lock:
            self._line(f"wanjax {self.command}: {text}")

    def __call__(self, stage: str, done: int) -> None:
        with self._lock:
            if stage != self.stage:
                self.stage, self.done, self.warm, self.reports = stage, 0, None, 0
                counted = f", {self.steps} steps" if stage == "denoise" else ""
                work = self.work.get(stage, self.work.get(stage.split(" ")[0], stage))
                now = self.clock()
                self._line(f"[{self._elapsed(now)}] {stage}: {work}{counted}", now)
            elif done and self.counted.get(stage, (0, ""))[0]:
                self._count(stage, done)

    def close(self) -> None:
        """End a line left open by the step count (a silent stage's word is erased)."""
        with self._lock:
            self._close()

    def _count(self, stage: str, done: int) -> None:
        total, unit = self.counted[stage]
        now = self.clock()
        self.reports += 1
        if self.reports == 1:  # the decode's first latent frame alone: it and the part after it compile
            self.warmup = 2 if stage == "decode" and done == 1 < total else 1
        if self.reports == self.warmup:
            self.warm = (now, done)
        self.done = done
        text = f"[{self._elapsed(now)}] {stage}: {unit} {done}/{total}"
        if self.warm is not None and done > self.warm[1]:
            per = (now - self.warm[0]) / (done - self.warm[1])
            text += f", {per:.3f} s/{unit}, about {per * (total - done):.1f} s left"
        if self.mode == "terminal":
            self._write(f"\r{text}\x1b[K", now)
            self.open_line = "count"
            if done == total:
                self._close()
        elif done in (1, total) or now - self.written >= LINE_EVERY:
            self._line(text, now)

    def _watch(self) -> None:
        """The thread's loop: a word for a stage silent for ``tick`` seconds."""
        assert self.tick is not None
        while not self._stop.wait(min(self.tick, TICK)):
            with self._lock:
                now = self.clock()
                if self.held and now - self.start >= self.hold:
                    self._write("", now)
                if self.stage is None or self.open_line == "count" or now - self.written < self.tick:
                    continue
                self._word(now)

    def _word(self, now: float) -> None:
        """A silent stage's line: how long it has worked, and on which unit."""
        assert self.stage is not None
        total, unit = self.counted.get(self.stage, (0, ""))
        if total and self.done < total:
            doing = f"{unit} {self.done + 1}/{total}"
            if self.done == 0:
                doing += " (the first compiles its program)"
        else:
            doing = "working"
        text = f"[{self._elapsed(now)}] {self.stage}: {doing}, still running"
        if self.mode == "terminal":
            self._write(f"\r{text}\x1b[K", now)
            self.open_line = "word"
        else:
            self._line(text, now)

    def _elapsed(self, now: float | None = None) -> str:
        return f"{(self.clock() if now is None else now) - self.start:6.1f} s"

    def _close(self) -> None:
        if self.open_line == "count":
            self._write("\n")
        elif self.open_line == "word":
            self._write("\r\x1b[K")
        self.open_line = None

    def _line(self, text: str, now: float | None = None) -> None:
        self._close()
        self._write(text + "\n", now)

    def _write(self, text: str, now: float | None = None) -> None:
        """``text`` out; ``now``: when (None: no time of its own, e.g. the header or a line's end)."""
        if not self.enabled:
            return
        if self.hold and (self.clock() if now is None else now) - self.start < self.hold:
            self.held.append(text)
        else:
            self.stream.write("".join(self.held) + text)
            self.stream.flush()
            self.held.clear()
        if now is not None:
            self.written = now
