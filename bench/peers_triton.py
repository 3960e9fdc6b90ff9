"""NVIDIA Triton (through PyTriton) serving one model for bench/peers.py, with its dynamic batcher.

`--workers` model instances (each its own copy of the model on its own thread, with
PEERS_TORCH_THREADS torch threads); the dynamic batcher forms batches of up to `--max-batch` requests, waiting at
most `--delay-ms` for more; a request that has waited in the queue longer than `--deadline-ms` is
rejected (Triton's queue policy, REJECT: it could no longer be on time, so dropping it is Triton's
best use of the device). Input `jpeg` (BYTES [1]); outputs `classes` (INT64 [5]), `scores`
(FP32 [5]). HTTP (KServe v2) on `--port`; gRPC and metrics on the two ports after it. PyTriton
calls the handler on a thread of its own; the model runs on the thread it was loaded on
(`peers_model.Model(own_thread=True)`).

Needs LD_LIBRARY_PATH to include this Python's own library directory (bench/peers.py sets it).

    .venv-peers/bin/python bench/peers_triton.py --model resnet18 --port 8000 \
        --max-batch 8 --delay-ms 5 --deadline-ms 300
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
from peers_args import launcher_parser  # bench/ is this script's folder
from peers_model import Model  # bench/ is this script's folder
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, QueuePolicy, Tensor
from pytriton.model_config.common import TimeoutAction
from pytriton.triton import Triton, TritonConfig


def main() -> None:
    ap = launcher_parser()
    ap.add_argument("--deadline-ms", type=float, default=0.0, help="queue timeout; 0: none")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    def instance() -> Callable[..., dict[str, np.ndarray]]:
        model = Model(args.model, warm_batches=(1, args.max_batch), own_thread=True)

        @batch
        def infer(jpeg: np.ndarray) -> dict[str, np.ndarray]:
            classes, scores = model.classify([bytes(row[0]) for row in jpeg])
            return {"classes": classes.astype(np.int64), "scores": scores.astype(np.float32)}

        return infer  # type: ignore[no-any-return]

    policy = (
        QueuePolicy(
            timeout_action=TimeoutAction.REJECT,
            default_timeout_microseconds=int(args.deadline_ms * 1000),
        )
        if args.deadline_ms > 0
        else None
    )
    config = TritonConfig(
        http_address="127.0.0.1",
        http_port=args.port,
        grpc_address="127.0.0.1",
        grpc_port=args.port + 1,
        metrics_port=args.port + 2,
        allow_metrics=False,
        log_verbose=0,
    )
    with Triton(config=config) as triton:
        triton.bind(
            model_name=args.model,
            infer_func=[instance() for _ in range(args.workers)],
            inputs=[Tensor(name="jpeg", dtype=bytes, shape=(1,))],
            outputs=[
                Tensor(name="classes", dtype=np.int64, shape=(5,)),
                Tensor(name="scores", dtype=np.float32, shape=(5,)),
            ],
            config=ModelConfig(
                max_batch_size=args.max_batch,
                batcher=DynamicBatcher(
                    max_queue_delay_microseconds=int(args.delay_ms * 1000),
                    default_queue_policy=policy,
                ),
            ),
            strict=False,
        )
        triton.serve()


if __name__ == "__main__":
    main()
