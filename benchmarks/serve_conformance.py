"""OpenAI conformance of ``wanjax serve``: schemathesis against the OpenAPI description it serves.

``src/wanjax/server/openapi.json`` (served at ``GET /openapi.json``) describes the six video
operations of ``wanjax serve`` (``POST``/``GET /v1/videos``, ``GET``/``DELETE /v1/videos/{video_id}``,
``GET /v1/videos/{video_id}/content``, ``POST /v1/videos/{video_id}/remix``), written from OpenAI's published description
(https://github.com/openai/openai-openapi, commit f85dbe223d40e1a31cba812ab2d755c7e98a92a3) and
changed only where wanjax deliberately differs (its ``info.description`` and the README's "Serving"
section list how). This script checks that the server does what that document says:

1. starts ``python -m wanjax.cli serve --model demo --host 127.0.0.1 --port 0 --output_dir TMP
   --api_key KEY --max_frames 9 --max_pixels 24576 --max_steps 10 --max_queue 2`` (the demo model:
   tiny and random; the smallest limits it starts with, so an accepted job takes a second or two, plus
   a compile for each new shape; a queue of 2, so most accepted requests past it are 429s) and waits
   for its ``wanjax serve: listening on URL`` line;
2. runs, in a temporary folder (schemathesis writes its caches into the working folder),
   ``schemathesis run URL/openapi.json --checks not_a_server_error,status_code_conformance,
   content_type_conformance,response_schema_conformance --header "Authorization: Bearer KEY"
   --max-examples N --seed S --workers 1 --request-timeout 60 --generation-database none
   --report ndjson`` (every phase: the document's examples, the coverage phase's boundary and
   negative values, random fuzzing, and stateful sequences along the document's links: create, then
   get, download and delete the new video); ``--max-examples`` bounds the test cases of each
   operation in a phase (the coverage phase's are fixed by the document: 267 today);
3. reads the NDJSON report: a table per operation of the requests sent and the status codes they
   got, and every failed check; stops the server (SIGTERM) and reads its log.

Exit status 1 if schemathesis failed or errored, a check failed, any answer was a 5xx, the server
logged a failure (``... failed:`` with a traceback) or did not stop cleanly. The server's timing (when
a job completes) steers the stateful phase, so two runs of one seed differ somewhat.

The tool: schemathesis 4.32.5 (``.venv/bin/pip install schemathesis==4.32.5``), a benchmark tool, not
a dependency of wanjax or its tests. The command (BENCHMARKS.md, "OpenAI conformance of ``wanjax
serve``"; about two minutes and 4,500 requests on 2 shared CPU cores)::

    .venv/bin/python benchmarks/serve_conformance.py                      # 1000 examples, seed 1
    .venv/bin/python benchmarks/serve_conformance.py --max_examples 20    # a smoke run
    .venv/bin/python benchmarks/serve_conformance.py --report_dir out/conformance   # keep the report
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

HOST = "127.0.0.1"
KEY = "conformance-key"
LISTENING = re.compile(r"wanjax serve: listening on (http://\S+)")
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"
SERVER_FLAGS = ["--max_frames", "9", "--max_pixels", "24576", "--max_steps", "10", "--max_queue", "2"]
OPERATIONS = (  # the document's, in its order
    "POST /v1/videos",
    "GET /v1/videos",
    "GET /v1/videos/{video_id}",
    "DELETE /v1/videos/{video_id}",
    "GET /v1/videos/{video_id}/content",
    "POST /v1/videos/{video_id}/remix",
)


def schemathesis_command() -> list[str]:
    """The schemathesis executable beside this Python's, else the one on PATH."""
    beside = Path(sys.executable).parent / "schemathesis"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("schemathesis")
    if found is None:
        sys.exit("schemathesis is not installed: .venv/bin/pip install schemathesis==4.32.5")
    return [found]


def start_server(output_dir: Path, log_dir: Path, timeout: float) -> tuple[subprocess.Popen, str]:
    """The demo server as a child process, and its URL once it listens."""
    command = [sys.executable, "-m", "wanjax.cli", "serve", "--model", "demo", "--host", HOST, "--port", "0"]
    command += ["--output_dir", str(output_dir), "--api_key", KEY, *SERVER_FLAGS]
    print("server:", " ".join(command).replace(KEY, "KEY"), flush=True)
    out, err = (log_dir / "server.out").open("w"), (log_dir / "server.err").open("w")
    env = {k: v for k, v in os.environ.items() if k != "WANJAX_API_KEY"}
    process = subprocess.Popen(command, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = LISTENING.search((log_dir / "server.out").read_text())
        if match:
            return process, match[1]
        if process.poll() is not None:
            sys.exit(
                f"the server exited ({process.returncode}): {(log_dir / 'server.err').read_text()[-2000:]}"
            )
        time.sleep(0.2)
    process.kill()
    sys.exit(f"the server did not start in {timeout:.0f} s")


def stop_server(process: subprocess.Popen) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)
    return process.returncode


def read_report(path: Path) -> dict:
    """Per operation: requests, status codes and failed checks; schemathesis's errors; its totals."""
    statuses: dict[str, Counter] = defaultdict(Counter)
    failures: Counter = Counter()  # one line each, with how often
    errors: list[str] = []
    phases: Counter = Counter()
    for line in path.read_text().splitlines():
        event = json.loads(line)
        name, body = next(iter(event.items()))
        if name == "NonFatalError" or name == "FatalError":
            errors.append(json.dumps(body)[:500])
        if name != "ScenarioFinished":
            continue
        recorder = body["recorder"]
        for case_id, interaction in recorder.get("interactions", {}).items():
            case = recorder["cases"].get(case_id, {}).get("value", {})
            label = f"{case.get('method', '?')} {case.get('path', '?')}"
            label = label if label in OPERATIONS else "other methods (405)"
            response = interaction.get("response")
            statuses[label][response["status_code"] if response else "no answer"] += 1
            phases[body["phase"]] += 1
        for case_id, checks in recorder.get("checks", {}).items():
            for check in checks:
                if check["status"] != "success":
                    case = recorder["cases"].get(case_id, {}).get("value", {})
                    failure = (check.get("failure_info") or {}).get("failure") or {}
                    text = f"{failure.get('title')}: {failure.get('message')}" if failure else "(no details)"
                    text = " ".join(text.split())[:300]
                    failures[f"{case.get('method')} {case.get('path')} {check['name']}: {text}"] += 1
    return {"statuses": statuses, "failures": failures, "errors": errors, "phases": phases}


def print_table(report: dict) -> None:
    rows = [(op, report["statuses"].get(op, Counter())) for op in (*OPERATIONS, "other methods (405)")]
    print(f"\n{'operation':<36} {'requests':>8}  status codes")
    for op, counts in rows:
        codes = ", ".join(f"{code}: {n}" for code, n in sorted(counts.items(), key=lambda kv: str(kv[0])))
        print(f"{op:<36} {sum(counts.values()):>8}  {codes}")
    total = sum(sum(c.values()) for c in report["statuses"].values())
    phases = ", ".join(f"{k} {v}" for k, v in report["phases"].items())
    print(f"{'all':<36} {total:>8}  ({phases})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--max_examples", type=int, default=1000, help="per operation and phase (default 1000)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--report_dir", help="keep schemathesis's report and the server's log here")
    parser.add_argument("--start_timeout", type=float, default=300.0)
    parser.add_argument("--timeout", type=float, default=900.0, help="schemathesis's run at most (s)")
    args = parser.parse_args()

    tool = schemathesis_command()
    version = subprocess.run([*tool, "--version"], capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="wanjax-conformance-") as tmp:
        tmp_path = Path(tmp)
        logs = Path(args.report_dir).resolve() if args.report_dir else tmp_path / "report"
        logs.mkdir(parents=True, exist_ok=True)
        process, url = start_server(tmp_path / "serve", logs, args.start_timeout)
        ndjson = logs / "schemathesis.ndjson"
        command = [*tool, "run", f"{url}/openapi.json", "--checks", CHECKS]
        command += ["--header", f"Authorization: Bearer {KEY}", "--max-examples", str(args.max_examples)]
        command += ["--seed", str(args.seed), "--workers", "1", "--request-timeout", "60"]
        command += ["--generation-database", "none", "--no-color"]
        command += ["--report", "ndjson", "--report-ndjson-path", str(ndjson)]
        print(f"{version}:", " ".join(command).replace(KEY, "KEY"), flush=True)
        started = time.monotonic()
        try:
            run = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=args.timeout)
            rc, output = run.returncode, run.stdout + run.stderr
        except subprocess.TimeoutExpired as e:
            rc, output = 124, f"schemathesis ran past {args.timeout:.0f} s\n{e.stdout or ''}"
        seconds = time.monotonic() - started
        alive = process.poll() is None
        server_rc = stop_server(process)
        server_log = (logs / "server.err").read_text() + (logs / "server.out").read_text()
        (logs / "schemathesis.txt").write_text(output)
        print(output[-6000:] if rc else "\n".join(output.splitlines()[-8:]))
        report = read_report(ndjson) if ndjson.exists() else None

    problems = []
    if rc != 0:
        problems.append(f"schemathesis exited with {rc}")
    if report is None:
        problems.append("no report")
    else:
        print_table(report)
        problems += [f"failed check ({n}x): {f}" for f, n in report["failures"].items()]
        problems += [f"schemathesis error: {e}" for e in report["errors"]]
        fives = sum(n for c in report["statuses"].values() for code, n in c.items() if str(code)[0] == "5")
        if fives:
            problems.append(f"{fives} answers were 5xx")
    if " failed:" in server_log:
        problems.append(
            "the server logged a failure:\n" + server_log[max(0, server_log.index(" failed:") - 200) :][:3000]
        )
    if not alive or server_rc != 0:
        problems.append(f"the server {'died' if not alive else 'stopped'} with status {server_rc}")
    print(f"\n{version}; --max-examples {args.max_examples} --seed {args.seed}; {seconds:.0f} s")
    print(f"result: {'FAIL' if problems else 'PASS'}")
    for problem in problems:
        print(" -", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
