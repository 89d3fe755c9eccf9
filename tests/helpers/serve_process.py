"""A real ``wanjax serve`` process on 127.0.0.1 and a small JSON client for it (the server tests')."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

LISTENING = "wanjax serve: listening on "
TERMINATED = 143  # the exit status of a server stopped by SIGTERM (128 + 15, as any wanjax command's)


class Server:
    """``wanjax serve --model MODEL --port 0 --output_dir DIR FLAGS...`` as a child process."""

    def __init__(
        self,
        output_dir: Path,
        *flags: str,
        model: str = "demo",
        api_key: str | None = None,
        env: dict | None = None,
    ):
        self.output_dir, self.flags, self.model, self.api_key = Path(output_dir), flags, model, api_key
        inherited = {k: v for k, v in os.environ.items() if k != "WANJAX_API_KEY"}  # the key: api_key
        self.env = {**inherited, **(env or {})}
        self.process: subprocess.Popen | None = None
        self.url = ""
        self.listening = ""  # the line saying it listens (and what it took back from a stopped server)
        self.stderr = ""
        self._stderr = tempfile.TemporaryFile("w+")  # noqa: SIM115 (a file: a chatty server never blocks on a pipe)

    def launch(self) -> Server:
        """Start the process (a multi-process server's other processes print nothing: use this)."""
        command = [sys.executable, "-m", "wanjax.cli", "serve", "--model", self.model, "--host", "127.0.0.1"]
        command += ["--port", "0", "--output_dir", str(self.output_dir), *self.flags]
        if self.api_key:
            command += ["--api_key", self.api_key]
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=self._stderr, env=self.env, text=True
        )
        return self

    def start(self, timeout: float = 180.0) -> Server:
        """Launch, and wait until it listens."""
        return self.launch().start_listening(timeout)

    def start_listening(self, timeout: float = 180.0) -> Server:
        """Wait until the launched process listens."""
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in self.process.stdout], daemon=True).start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=0.5)
            except queue.Empty:
                if self.process.poll() is not None:
                    raise RuntimeError(f"the server exited: {self.read_stderr()}") from None
                continue
            if line.startswith(LISTENING):
                self.listening = line.rstrip("\n")
                self.url = line[len(LISTENING) :].split()[0]
                return self
        self.kill()
        raise TimeoutError(f"the server did not start: {self.read_stderr()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL: no clean-up of any kind."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)

    def stop(self, signal_it: bool = True) -> int:
        """SIGTERM, as a service manager stops it (``signal_it`` False: wait for it to end); the exit
        status."""
        if self.process is None:
            return 0
        if self.process.poll() is None:
            if signal_it:
                self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()
        self.stderr = self.read_stderr()
        return self.process.returncode

    def read_stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        key: str | None = "default",
        raw: bytes | None = None,
        headers: dict | None = None,
    ) -> tuple[int, Any, dict]:
        """``(status, JSON body or bytes, headers)``; ``key`` None sends no key, "default" the server's."""
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        sent = {"Content-Type": "application/json", **(headers or {})}
        key = self.api_key if key == "default" else key
        if key:
            sent["Authorization"] = f"Bearer {key}"
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=sent)
        try:
            with urllib.request.urlopen(req, timeout=60) as response:
                status, payload, got = response.status, response.read(), dict(response.headers)
        except urllib.error.HTTPError as e:
            status, payload, got = e.code, e.read(), dict(e.headers)
        if got.get("content-type", "").startswith("application/json"):
            return status, json.loads(payload), got
        return status, payload, got

    def submit(self, **fields: Any) -> dict:
        status, video, _ = self.request("POST", "/v1/videos", fields)
        assert status == 202, video
        return video

    def wait(self, job_id: str, status: str = "completed", timeout: float = 180.0) -> dict:
        """Poll the job until it has ``status`` (or failed)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code, video, _ = self.request("GET", f"/v1/videos/{job_id}")
            assert code == 200, video
            if video["status"] == status or video["status"] == "failed":
                assert video["status"] == status, video
                return video
            time.sleep(0.1)
        raise TimeoutError(f"job {job_id} not {status} in {timeout} s")


def multipart(**fields: str | tuple[str, bytes]) -> tuple[bytes, dict[str, str]]:
    """A ``multipart/form-data`` body of ``fields`` (text, or ``(file name, bytes)`` for a file) and
    its ``Content-Type`` header."""
    parts = []
    for name, value in fields.items():
        if isinstance(value, tuple):
            head = f'name="{name}"; filename="{value[0]}"\r\nContent-Type: application/octet-stream'
            data = value[1]
        else:
            head, data = f'name="{name}"', value.encode()
        parts.append(f"--B\r\nContent-Disposition: form-data; {head}\r\n\r\n".encode() + data + b"\r\n")
    return b"".join(parts) + b"--B--\r\n", {"Content-Type": "multipart/form-data; boundary=B"}


def serve_mistake(capsys, *args: str) -> str:
    """``wanjax serve ARGS``'s one-line error (exit 2, nothing on stdout), run in this process."""
    from wanjax.cli.main import main

    code = main(["serve", *args])
    out, err = capsys.readouterr()
    assert (code, out) == (2, ""), (code, out, err)
    assert err.count("\n") == 1 and err.startswith("wanjax: error: "), err
    return err
