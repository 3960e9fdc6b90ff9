"""PPipe's measured GPU block timings (JonnyKong/PPipe `data/models/`) as layerbatch profiles.

`block-timing-tf32/{model}-{GPU}-{m}.csv`: one row per pre-partitioned block, one column per batch
size from 1, microseconds, TensorRT tf32, MPS level m. `transfer-sizes/{model}.csv`: bytes per
sample crossing the cut after each block except the last, counted as fp16 (2 bytes a value).

    python -m sim.ppipe SRC_DIR OUT_DIR   # writes {model}-{gpu}.json for the shipped set
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from scheduler.profile import dumps_profile

# model -> input shape (C, H, W) of the network as PPipe profiled it
SHIPPED = {
    "googlenet-v3-pytorch": [3, 299, 299],
    "repvgg-b3": [3, 224, 224],
    "wide_resnet101_2": [3, 224, 224],
    "resnext152-32x4d_8xb32_in1k": [3, 224, 224],
    "efficientnet-b8_3rdparty_8xb32-aa-advprop_in1k": [3, 672, 672],
    "fcn-d6_r101-d16_4xb2-40k_cityscapes-512x1024": [3, 512, 1024],
}
SHORT = {
    "resnext152-32x4d_8xb32_in1k": "resnext152-32x4d",
    "efficientnet-b8_3rdparty_8xb32-aa-advprop_in1k": "efficientnet-b8",
    "fcn-d6_r101-d16_4xb2-40k_cityscapes-512x1024": "fcn-r101-cityscapes",
}
GPUS = ("V100", "T4")
MAX_BATCH = 32


def load_block_timing_us(path: Path) -> np.ndarray:
    """[blocks, batch sizes 1..n] in microseconds."""
    rows = [ln for ln in path.read_text().splitlines() if ln.strip()]
    return np.array([[float(x) for x in ln.split(",")] for ln in rows])


def load_transfer_bytes(path: Path) -> list[int]:
    return [int(float(ln)) for ln in path.read_text().splitlines() if ln.strip()]


def profile_json(
    model: str, gpu: str, timing_us: np.ndarray, transfer_fp16: list[int], input_shape: list[int]
) -> dict[str, Any]:
    """A `layerbatch.profile/1` document: one stage per block, latencies in ms, out_bytes in fp32
    (twice PPipe's fp16 count); the last block's output size is not measured (0)."""
    blocks, sizes = timing_us.shape
    stages = []
    for k in range(blocks):
        out = 2 * transfer_fp16[k] if k < len(transfer_fp16) else 0
        stages.append(
            {
                "name": f"block{k}",
                "latency_ms": [round(float(x) / 1000.0, 4) for x in timing_us[k]],
                "out_shape": None,
                "out_bytes": out,
            }
        )
    return {
        "format": "layerbatch.profile/1",
        "model": SHORT.get(model, model),
        "device": f"{gpu}-tensorrt-tf32",
        "input": {"shape": input_shape, "dtype": "float32"},
        "batch_sizes": list(range(1, sizes + 1)),
        "stages": stages,
        "max_batch": MAX_BATCH,
        "source": f"PPipe data/models/block-timing-tf32/{model}-{gpu}-1.csv",
    }


def main(argv: list[str]) -> int:
    src, out = Path(argv[0]), Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for model, shape in SHIPPED.items():
        transfer = load_transfer_bytes(src / "transfer-sizes" / f"{model}.csv")
        for gpu in GPUS:
            timing = load_block_timing_us(src / "block-timing-tf32" / f"{model}-{gpu}-1.csv")
            doc = profile_json(model, gpu, timing, transfer, shape)
            (out / f"{SHORT.get(model, model)}-{gpu}.json").write_text(dumps_profile(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
