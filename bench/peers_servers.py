"""The servers bench/peers.py starts: each one's command line, its process in a session of its
own (paused, resumed, stopped, its CPU seconds counted), on free ports."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from bench.peers_knobs import Knobs

ROOT = Path(__file__).resolve().parent.parent
SERVERS = ("layerbatch", "triton", "ray", "torchserve")
MAIN_PY = ROOT / ".venv" / "bin" / "python"


def free_port(span: int = 5) -> int:
    """A port p with p .. p + span - 1 free (Triton uses the next two, TorchServe four: its
    management, metrics and two gRPC ports, which default to fixed ones that a second
    TorchServe beside it could not bind)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = int(s.getsockname()[1])
        if p + span >= 65535:
            continue
        try:
            socks = []
            for q in range(p, p + span):
                t = socket.socket()
                socks.append(t)
                t.bind(("127.0.0.1", q))
            return p
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()
    raise RuntimeError("no free ports")


def server_command(
    server: str,
    model: str,
    knobs: Knobs,
    deadline_ms: float,
    port: int,
    policy: str,
    fold_peers: bool = False,
    step_log: Path | None = None,
) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PEERS_TORCH_THREADS": str(knobs.threads)}
    env["PEERS_FOLD_BN"] = "1" if fold_peers else "0"
    here = ROOT / "bench"
    if server == "layerbatch":
        cmd = [str(MAIN_PY), "-m", "layerbatch", "serve", "--apps", model]
        cmd += ["--threads", str(knobs.threads), "--port", str(port), "--policy", policy]
        cmd += ["--deadline-ms", f"{deadline_ms:g}"]
        if knobs.workers > 1:
            cmd += ["--replicas", str(knobs.workers)]
        if step_log is not None:
            cmd += ["--step-log", str(step_log)]
        return cmd, env
    py = sys.executable
    common = ["--model", model, "--port", str(port), "--max-batch", str(knobs.max_batch)]
    common += ["--delay-ms", f"{knobs.delay_ms:g}", "--workers", str(knobs.workers)]
    if server == "triton":
        libdir = str(sysconfig.get_config_var("LIBDIR"))
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (libdir, os.environ.get("LD_LIBRARY_PATH", "")) if p
        )
        return [
            py,
            str(here / "peers_triton.py"),
            *common,
            "--deadline-ms",
            f"{deadline_ms:g}",
        ], env
    if server == "ray":
        return [py, str(here / "peers_ray.py"), *common], env
    if server == "torchserve":
        return [py, str(here / "peers_torchserve.py"), *common], env
    raise ValueError(f"unknown server {server!r}: expected one of {', '.join(SERVERS)}")


def session_pids(sid: int) -> list[int]:
    """The ids of the processes now in session `sid` (a server's, with every process it started:
    Ray's workers each lead a process group of their own, but stay in its session)."""
    out = subprocess.run(["ps", "-eo", "pid=,sid="], capture_output=True, text=True)
    return [
        int(p)
        for p, s in (ln.split() for ln in out.stdout.splitlines() if ln.strip())
        if int(s) == sid
    ]


def proc_stat(pid: int) -> list[str]:
    """A process's /proc/PID/stat fields from field 3 (its state letter) on, after the command
    name (which may hold spaces); raises OSError once the process is gone."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def session_cpu_s(sid: int) -> float:
    """The CPU seconds (user and system) used so far by the processes now in session `sid`."""
    total_ticks = 0
    for pid in session_pids(sid):
        try:
            fields = proc_stat(pid)
        except OSError:  # gone since it was listed
            continue
        total_ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total_ticks / os.sysconf("SC_CLK_TCK")


def signal_session(sid: int, sig: signal.Signals) -> None:
    """Send `sig` to every process now in session `sid` (those gone meanwhile: nothing)."""
    for pid in session_pids(sid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


class Running:
    """One server process (its own session, so that everything it started stops with it)."""

    def __init__(
        self,
        server: str,
        model: str,
        knobs: Knobs,
        deadline_ms: float,
        logdir: Path,
        policy: str = "dp-tardy",
        fold_peers: bool = False,
        step_log: bool = False,
        root: Path = ROOT,
    ) -> None:
        """`step_log`: layerbatch writes its steps beside its log, as .steps.jsonl. `root`: the
        checkout layerbatch's server runs from (its working directory, which `python -m`
        imports from first), this one by default."""
        self.server, self.model, self.knobs = server, model, knobs
        self.deadline_ms = deadline_ms  # the one it was started with (Triton's queue policy)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        logdir.mkdir(parents=True, exist_ok=True)
        self.log = logdir / f"{server}-{model}-{knobs.label.replace(',', '_')}-{self.port}.log"
        steps = self.log.with_suffix(".steps.jsonl") if step_log else None
        cmd, env = server_command(
            server, model, knobs, deadline_ms, self.port, policy, fold_peers, steps
        )
        self._logf = self.log.open("wb")
        self.proc = subprocess.Popen(
            cmd, stdout=self._logf, stderr=subprocess.STDOUT, env=env, cwd=root,
            start_new_session=True,
        )  # fmt: skip
        self.started = time.monotonic()
        self.ready_s: float | None = None
        self.pids: list[int] = []

    def descendants(self) -> list[int]:
        """The process ids in this server's session."""
        return session_pids(self.proc.pid)

    def cpu_s(self) -> float:
        return session_cpu_s(self.proc.pid)

    def pause(self, paused: bool) -> None:
        """Stop (SIGSTOP) or continue (SIGCONT) every process in this server's session."""
        signal_session(self.proc.pid, signal.SIGSTOP if paused else signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM to the server's process group (it stops what it started), then SIGKILL to
        whatever is left in its session."""
        self.pause(False)  # a stopped process would not act on SIGTERM
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        for wait_s in (15.0, 10.0):
            end = time.monotonic() + wait_s
            while time.monotonic() < end and self.descendants():
                self.proc.poll()
                time.sleep(0.3)
            if not self.descendants():
                break
            signal_session(self.proc.pid, signal.SIGKILL)
        self.proc.poll()
        self._logf.close()

    def tail(self, n: int = 1500) -> str:
        return self.log.read_bytes()[-n:].decode(errors="replace")
