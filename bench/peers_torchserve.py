"""TorchServe serving one model for bench/peers.py, with its server-side batching.

Archives bench/peers_ts_handler.py as `{model}.mar` (torch-model-archiver) in a scratch model
store, starts TorchServe in the foreground (`--workers` Python workers, each with
PEERS_TORCH_THREADS torch threads; token auth off, no config snapshots, the model API on) and
registers the model with `batch_size=--max-batch` and `max_batch_delay=--delay-ms`. POST the JPEG as the body to
`http://127.0.0.1:PORT/predictions/{model}`; the answer is JSON. Management API on PORT + 1.

    .venv-peers/bin/python bench/peers_torchserve.py --model resnet18 --port 8000 \
        --max-batch 8 --delay-ms 5
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from peers_args import launcher_parser  # bench/ is this script's folder

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = launcher_parser()
    ap.add_argument("--queue", type=int, default=1000, help="job_queue_size")
    args = ap.parse_args()
    bindir = Path(sys.executable).parent
    work = Path(tempfile.mkdtemp(prefix="peers-ts-"))
    store = work / "store"
    store.mkdir()
    subprocess.run(
        [
            str(bindir / "torch-model-archiver"),
            "--model-name",
            args.model,
            "--version",
            "1.0",
            "--handler",
            str(HERE / "peers_ts_handler.py"),
            "--export-path",
            str(store),
            "--force",
        ],
        check=True,
    )
    mgmt = args.port + 1
    (work / "config.properties").write_text(
        "\n".join(
            [
                f"inference_address=http://127.0.0.1:{args.port}",
                f"management_address=http://127.0.0.1:{mgmt}",
                f"metrics_address=http://127.0.0.1:{args.port + 2}",
                f"grpc_inference_port={args.port + 3}",
                f"grpc_management_port={args.port + 4}",
                f"default_workers_per_model={args.workers}",
                f"job_queue_size={args.queue}",
                "disable_system_metrics=true",
                "install_py_dep_per_model=false",
                f"model_store={store}",
                "",
            ]
        )
    )
    env = {
        **os.environ,
        "BENCH_DIR": str(HERE),
        "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)]),
        "OMP_NUM_THREADS": os.environ.get("PEERS_TORCH_THREADS", "2"),
        "LOG_LOCATION": str(work / "logs"),
        "METRICS_LOCATION": str(work / "logs"),
        "TMPDIR": str(work),  # its pid file (.model_server.pid) is private to this launch
    }
    ts = subprocess.Popen(
        [
            str(bindir / "torchserve"),
            "--start",
            "--foreground",
            "--ncs",
            "--disable-token-auth",
            "--enable-model-api",
            "--model-store",
            str(store),
            "--ts-config",
            str(work / "config.properties"),
        ],
        env=env,
        cwd=work,
        stdout=subprocess.DEVNULL,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not stop.is_set():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{args.port}/ping", timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                time.sleep(0.5)
        query = (
            f"url={args.model}.mar&model_name={args.model}&batch_size={args.max_batch}"
            f"&max_batch_delay={round(args.delay_ms)}&initial_workers={args.workers}&synchronous=true"
            "&response_timeout=120"
        )
        req = urllib.request.Request(f"http://127.0.0.1:{mgmt}/models?{query}", method="POST")
        with urllib.request.urlopen(req, timeout=180) as r:
            print(r.read().decode().strip(), flush=True)
        print("ready", flush=True)
        while not stop.is_set() and ts.poll() is None:
            stop.wait(0.5)
    finally:
        _stop_java(work / ".model_server.pid")
        if ts.poll() is None:
            ts.terminate()
            ts.wait(timeout=20)
        shutil.rmtree(work, ignore_errors=True)


def _stop_java(pid_file: Path) -> None:
    """Terminate the Java frontend this launch started (it stops its Python worker)."""
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    for sig, wait_s in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


if __name__ == "__main__":
    main()
