"""PPipe's measured GPU block timings (JonnyKong/PPipe `data/models/`) as layerbatch profiles.

`block-timing-tf32/{model}-{GPU}-{m}.csv`: one row per pre-partitioned block, one column per batch
size from 1, microseconds, TensorRT tf32, MPS level m. `transfer-sizes/{model}.csv`: bytes per
sample crossing the cut after each block except the last, counted as fp16 (2 bytes a value).

    python -m sim.ppipe SRC_DIR OUT_DIR   # writes {model}-{gpu}.json for the shipped set

The files are read by the pipeline planner's readers (`scheduler.pipeline.profiles`), so a bad
cell is refused as it is there: one line naming the file, the row (and the column) and what was
expected, e.g. a latency above an hour. A transfer-sizes file must hold one size per cut (a row
fewer than the block timings); each profile is validated by `scheduler.profile.parse_profile`
before it is written, so the converter never writes one that the loader would refuse.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from scheduler.errors import InputError
from scheduler.pipeline.profiles import read_block_timing_us, read_cut_bytes
from scheduler.profile import dumps_profile, parse_profile

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
    """[blocks, batch sizes 1..n] in microseconds, each positive and at most an hour;
    InputError (one line naming the file and the row) otherwise."""
    return np.array(read_block_timing_us(path))


def load_transfer_bytes(path: Path, blocks: int) -> list[int]:
    """Bytes per sample (fp16) of each of the `blocks - 1` cuts, one integer per row;
    InputError (one line naming the file) otherwise."""
    sizes = list(read_cut_bytes(path))
    if len(sizes) != blocks - 1:
        raise InputError(
            str(path), "", f"a size per cut, {blocks - 1} for the {blocks} blocks timed", len(sizes)
        )
    return sizes


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


def convert(src: Path, out: Path) -> None:
    """Write `{model}-{gpu}.json` under `out` for every SHIPPED model and GPU from PPipe's
    `src/block-timing-tf32/` and `src/transfer-sizes/`; InputError on the first bad file."""
    for model, shape in SHIPPED.items():
        for gpu in GPUS:
            timing = load_block_timing_us(src / "block-timing-tf32" / f"{model}-{gpu}-1.csv")
            transfer_file = src / "transfer-sizes" / f"{model}.csv"
            transfer = load_transfer_bytes(transfer_file, timing.shape[0])
            doc = profile_json(model, gpu, timing, transfer, shape)
            target = out / f"{SHORT.get(model, model)}-{gpu}.json"
            parse_profile(doc, str(target))  # what every reader of it will check
            out.mkdir(parents=True, exist_ok=True)
            target.write_text(dumps_profile(doc))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m sim.ppipe SRC_DIR OUT_DIR", file=sys.stderr)
        return 2
    try:
        convert(Path(argv[0]), Path(argv[1]))
    except InputError as exc:
        print(f"sim.ppipe: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
