"""Status lines while a run works, on a terminal only: the header first, a line as each stage starts
(with the time since the start), and the denoising steps and the decoded latent frames counted in
place with an ETA. Piped or ``--quiet``, a run prints its final table alone."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from typing import TextIO

# What each stage of :func:`wanjax.jobs.generate.run_generate` does, as its line says it
STAGE_WORK = {
    "encode": "the text encoder (loaded and compiled on first use)",
    "denoise": "the transformer",
    "decode": "the VAE decoder (loaded and compiled on first use)",
    "write": "the outputs",
}


# What each step of the ``encode`` job does
ENCODE_WORK = {
    "encode": "the text encoder (loaded and compiled on first use)",
    "image": "the image's conditioning: the image encoder and the VAE encoder",
    "video": "the video to re-make: the VAE encoder",
    "vace": "the VACE control (video, mask, reference images): the VAE encoder",
    "write": "the stage files",
}


def headline(model: str, batch: int, video: dict, steps: int | None = None) -> str:
    """What a run makes, in one line: the model, the videos (``video``'s frames, width and height)
    and the denoising steps."""
    videos = f"{batch} video{'s' if batch > 1 else ''} of {video['frames']} frames {video['width']}x{video['height']}"
    return f"model {model}, {videos}" + (f", {steps} steps" if steps else "")


class Status:
    """``status(stage, done)``: the ``on_progress`` of a run (see :func:`~wanjax.jobs.generate.run_generate`);
    ``steps`` is the denoising steps' count, ``frames`` the latent frames the decode reports as it goes
    (0: it does not), ``work`` what each stage does (default :data:`STAGE_WORK`). Prints nothing when
    not ``enabled``."""

    def __init__(
        self,
        command: str,
        steps: int,
        stream: TextIO | None = None,
        enabled: bool = True,
        clock: Callable[[], float] = time.perf_counter,
        work: Mapping[str, str] = STAGE_WORK,
        frames: int = 0,
    ):
        self.command, self.steps, self.stream, self.enabled = command, steps, stream or sys.stderr, enabled
        self.work = work
        self.counted = {"denoise": (steps, "step"), "decode": (frames, "latent frame")}
        self.clock, self.start = clock, clock()
        self.stage: str | None = None
        self.first_done: float | None = None  # after the stage's first unit (its time includes the compile)
        self.open_line = False

    @classmethod
    def for_terminal(
        cls, command: str, steps: int, quiet: bool, work: Mapping[str, str] = STAGE_WORK, frames: int = 0
    ) -> Status:
        """Enabled when stderr is a terminal, the run is not ``quiet`` and this is process 0."""
        from wanjax.parallel.multihost import is_primary

        enabled = not quiet and sys.stderr.isatty() and is_primary()
        return cls(command, steps, enabled=enabled, work=work, frames=frames)

    def header(self, text: str) -> None:
        self._line(f"wanjax {self.command}: {text}")

    def __call__(self, stage: str, done: int) -> None:
        if stage != self.stage:
            self.stage, self.first_done = stage, None
            counted = f", {self.steps} steps" if stage == "denoise" else ""
            self._line(f"[{self._elapsed()}] {stage}: {self.work.get(stage, stage)}{counted}")
        elif done and self.counted.get(stage, (0, ""))[0]:
            self._count(stage, done)

    def close(self) -> None:
        """End a line left open by the step count."""
        if self.open_line:
            self._write("\n")
            self.open_line = False

    def _count(self, stage: str, done: int) -> None:
        total, unit = self.counted[stage]
        now = self.clock()
        if done == 1:
            self.first_done = now
        text = f"[{self._elapsed(now)}] {stage}: {unit} {done}/{total}"
        if done > 1 and self.first_done is not None:
            per = (now - self.first_done) / (done - 1)
            text += f", {per:.3f} s/{unit}, about {per * (total - done):.1f} s left"
        self._write(f"\r{text}\x1b[K")
        self.open_line = True
        if done == total:
            self.close()

    def _elapsed(self, now: float | None = None) -> str:
        return f"{(self.clock() if now is None else now) - self.start:6.1f} s"

    def _line(self, text: str) -> None:
        self.close()
        self._write(text + "\n")

    def _write(self, text: str) -> None:
        if self.enabled:
            self.stream.write(text)
            self.stream.flush()
