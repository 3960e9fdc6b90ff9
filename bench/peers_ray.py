"""Ray Serve serving one model for bench/peers.py, batching with `@serve.batch`.

`--workers` replicas (Ray started with 2 CPUs, no dashboard; each replica with
PEERS_TORCH_THREADS torch threads); `@serve.batch(max_batch_size=--max-batch,
batch_wait_timeout_s=--delay-ms / 1000)`; `max_ongoing_requests` is set well above the batch size
(Ray's default, 5, would cap every batch at 5 and queue the rest in the proxy). The batch runs on
a worker thread (`asyncio.to_thread`) so the replica's loop keeps taking requests meanwhile; the
model runs on the thread it was loaded on (`peers_model.Model(own_thread=True)`).
POST the JPEG as the body to `http://127.0.0.1:PORT/{model}`; the answer is JSON.

    .venv-peers/bin/python bench/peers_ray.py --model resnet18 --port 8000 --max-batch 8 --delay-ms 5
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from peers_args import launcher_parser  # bench/ is this script's folder

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = launcher_parser()
    ap.add_argument("--max-ongoing", type=int, default=256)
    args = ap.parse_args()

    import ray
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    @serve.deployment(
        num_replicas=args.workers,
        max_ongoing_requests=args.max_ongoing,
        ray_actor_options={"num_cpus": 1},
    )
    class Classifier:
        def __init__(self, name: str, max_batch: int, delay_s: float) -> None:
            sys.path.insert(0, str(HERE))
            from peers_model import Model

            self.model = Model(name, warm_batches=(1, max_batch), own_thread=True)
            self.handle_batch.set_max_batch_size(max_batch)
            self.handle_batch.set_batch_wait_timeout_s(delay_s)

        @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.005)
        async def handle_batch(self, bodies: list[bytes]) -> list[dict[str, Any]]:
            return await asyncio.to_thread(self.model.infer, bodies)

        async def __call__(self, request: Request) -> JSONResponse:
            return JSONResponse(await self.handle_batch(await request.body()))

    env = {
        "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)]),
        "OMP_NUM_THREADS": os.environ.get("PEERS_TORCH_THREADS", "2"),
        "PEERS_TORCH_THREADS": os.environ.get("PEERS_TORCH_THREADS", "2"),
    }
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": env},
        configure_logging=False,
    )
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    serve.run(
        # serve.deployment made the class a Deployment; mypy, without ray, sees the class
        Classifier.bind(args.model, args.max_batch, args.delay_ms / 1000.0),  # type: ignore[attr-defined]
        name=args.model,
        route_prefix=f"/{args.model}",
    )
    print("ready", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    serve.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
