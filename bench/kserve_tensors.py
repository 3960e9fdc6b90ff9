"""A KServe v2 request body to the server's input tensor, its tensor sent as JSON numbers and as
binary data (Triton's extension), side by side. Both run on the server's event loop, holding it
(and every other request) while they run: the JSON path is `server.wire.decode_body` then
`server.kserve_tensors.input_tensor`, the binary one `split_body` then the same `input_tensor`.
Target: ratio (JSON / binary) well above 1, so that a client sending large batches is told to
send binary data (tritonclient's default).

Side by side in one run: each repetition times both paths on the same random tensor,
alternating which goes first. Reported: median ms per request of each over the repetitions, and
the median of the per-repetition ratios.

    .venv/bin/python bench/kserve_tensors.py [--samples 8] [--shape 3,224,224] [--reps 7]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable

import numpy as np

from server.kserve_tensors import input_tensor, split_body
from server.wire import JSON, MAX_ITEMS, decode_body


def bodies(x: np.ndarray) -> tuple[bytes, tuple[bytes, str]]:
    """The JSON body, and the binary body with its Inference-Header-Content-Length."""
    tensor = {"name": "INPUT", "datatype": "FP32", "shape": list(x.shape)}
    as_json = json.dumps({"inputs": [{**tensor, "data": x.flatten().tolist()}]}).encode()
    blob = x.astype("<f4").tobytes()
    header = json.dumps(
        {"inputs": [{**tensor, "parameters": {"binary_data_size": len(blob)}}]}
    ).encode()
    return as_json, (header + blob, str(len(header)))


def timed_ms(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=8, help="N in the [N, C, H, W] input")
    ap.add_argument("--shape", default="3,224,224", help="C,H,W of one sample")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    shape = tuple(int(v) for v in args.shape.split(","))
    x = np.random.default_rng(0).standard_normal((args.samples, *shape)).astype(np.float32)
    as_json, (as_binary, header_length) = bodies(x)
    values = math.prod(x.shape) + MAX_ITEMS

    def json_path() -> object:
        doc = decode_body(as_json, JSON, max_json_values=values)
        return input_tensor(doc["inputs"][0], b"", shape, args.samples)

    def binary_path() -> object:
        header, blob = split_body(as_binary, header_length)
        doc = decode_body(header, JSON)
        return input_tensor(doc["inputs"][0], blob, shape, args.samples)

    a, b = json_path(), binary_path()
    assert np.array_equal(np.asarray(a), np.asarray(b)), "the two paths disagree"
    json_ms: list[float] = []
    binary_ms: list[float] = []
    for rep in range(args.reps):
        order = [(json_path, json_ms), (binary_path, binary_ms)]
        for fn, out in order if rep % 2 == 0 else order[::-1]:
            out.append(timed_ms(fn))
    ratios = [j / b for j, b in zip(json_ms, binary_ms, strict=True)]
    print(
        f"[{args.samples}, {args.shape}] FP32: body {len(as_json) / 1e6:.1f} MB as JSON, "
        f"{len(as_binary) / 1e6:.1f} MB as binary"
    )
    print(f"JSON   {statistics.median(json_ms):9.2f} ms a request (on the event loop)")
    print(f"binary {statistics.median(binary_ms):9.2f} ms a request")
    print(f"ratio (JSON / binary): {statistics.median(ratios):.0f}x")


if __name__ == "__main__":
    main()
