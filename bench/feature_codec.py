"""Size and time of the feature-map codec (INT8 per-tensor quantisation, planes tiled into one
grayscale frame, lossless H.264: `layerexec.features`, paper 003 sections 4.4 and 5.2) against
general-purpose compressors of the same quantised bytes, on real feature maps.

For each model and split k, the stage-k inputs of real frames of the bundled video (one sample at
a time, as a client sends them) go through every codec side by side in one run:
  f32    the float32 map as it is (size only);
  raw    quantise, the uint8 bytes as they are (`encode_features(..., "raw")`);
  h264   quantise + tile + lossless H.264 (`encode_features(..., "h264")`);
  zlib1, zlib6   quantise + zlib level 1 / 6 of the uint8 bytes;
  lzma0, lzma6   quantise + lzma (xz) preset 0 / 6 of the uint8 bytes.
Encode times include quantisation; decode times include dequantisation back to a float32
tensor, so every codec is timed from float map to float map. All codecs are lossless on the
uint8 bytes: the bench checks that each decodes to exactly the same tensor as raw.

Sizes are means over the frames; times are medians over frames x --repeats, with the order of
the codecs rotated from one repetition to the next (this machine drifts from second to second).
Ratios are taken within the run. The per-model summary is the geometric mean over its splits.
resnet18, mobilenet_v2 and googlenet carry seeded random weights here (no pretrained weights can
be downloaded); resnet20_cifar10 and ultraface_slim320 carry their real weights.

    .venv/bin/python bench/feature_codec.py [--models resnet18,...] [--frames 4] [--repeats 3]
        [--splits 5] [--json-out [FILE]]
"""

from __future__ import annotations

import argparse
import json
import lzma
import math
import platform
import statistics
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import av
import numpy as np
import torch

from client.frames import video_frames
from layerexec.features import decode_features, encode_features
from layerexec.images import rgb_tensor
from layerexec.quant import Quantised, dequantise, quantise
from layerexec.zoo import load_model

DEFAULT_MODELS = "resnet18,mobilenet_v2,googlenet,resnet20_cifar10,ultraface_slim320"
DEFAULT_JSON = "bench/results/feature_codec.json"
CODECS = ("raw", "h264", "zlib1", "zlib6", "lzma0", "lzma6")
REAL_WEIGHTS = ("resnet20_cifar10", "ultraface_slim320")

Encoded = tuple[tuple[int, ...], float, int, bytes]  # shape, scale, zero point, data
Codec = tuple[Callable[[torch.Tensor], Encoded], Callable[[Encoded], torch.Tensor]]


def _feature_codec(name: str) -> Codec:
    """The product's own path: `encode_features` / `decode_features`."""

    def enc(x: torch.Tensor) -> Encoded:
        ef = encode_features(x, 0, name)
        return ef.shape, ef.scale, ef.zero_point, ef.data

    def dec(e: Encoded) -> torch.Tensor:
        return decode_features(e[0], e[1], e[2], name, e[3])

    return enc, dec


def _bytes_codec(compress: Callable[[bytes], bytes], decompress: Callable[[bytes], bytes]) -> Codec:
    """The same quantisation, then a general-purpose compressor of the uint8 bytes."""

    def enc(x: torch.Tensor) -> Encoded:
        q = quantise(x.detach().cpu())
        return tuple(x.shape), q.scale, q.zero_point, compress(q.data.numpy().tobytes())

    def dec(e: Encoded) -> torch.Tensor:
        arr = np.frombuffer(decompress(e[3]), dtype=np.uint8).reshape(e[0])
        return dequantise(Quantised(torch.from_numpy(arr.copy()), e[1], e[2]))

    return enc, dec


def codecs() -> dict[str, Codec]:
    return {
        "raw": _feature_codec("raw"),
        "h264": _feature_codec("h264"),
        "zlib1": _bytes_codec(lambda b: zlib.compress(b, 1), zlib.decompress),
        "zlib6": _bytes_codec(lambda b: zlib.compress(b, 6), zlib.decompress),
        "lzma0": _bytes_codec(lambda b: lzma.compress(b, preset=0), lzma.decompress),
        "lzma6": _bytes_codec(lambda b: lzma.compress(b, preset=6), lzma.decompress),
    }


def splits(n_stages: int, count: int) -> list[int]:
    """`count` split points spread evenly over 1..n_stages-1 (all of them if count <= 0)."""
    legal = list(range(1, n_stages))
    if count <= 0 or count >= len(legal):
        return legal
    return sorted({legal[round(i * (len(legal) - 1) / (count - 1))] for i in range(count)})


def measure(maps: list[torch.Tensor], repeats: int, table: dict[str, Codec]) -> dict[str, Any]:
    """Sizes (mean bytes) and times (median ms) of every codec on every map, side by side."""
    names = list(table)
    size: dict[str, list[int]] = {c: [] for c in names}
    enc_ms: dict[str, list[float]] = {c: [] for c in names}
    dec_ms: dict[str, list[float]] = {c: [] for c in names}
    for x in maps:
        decoded: dict[str, torch.Tensor] = {}
        for rep in range(repeats + 1):  # repetition 0 warms up and is not timed
            shift = rep % len(names)
            for c in names[shift:] + names[:shift]:
                enc, dec = table[c]
                t0 = time.perf_counter()
                e = enc(x)
                t1 = time.perf_counter()
                y = dec(e)
                t2 = time.perf_counter()
                if rep == 0:
                    size[c].append(len(e[3]))
                    decoded[c] = y
                else:
                    enc_ms[c].append((t1 - t0) * 1e3)
                    dec_ms[c].append((t2 - t1) * 1e3)
        for c in names:  # every codec is lossless on the quantised bytes
            if not torch.equal(decoded[c], decoded["raw"]):
                raise AssertionError(f"{c} did not decode to the same tensor as raw")
    return {
        "f32_bytes": 4 * maps[0].numel(),
        "bytes": {c: statistics.fmean(size[c]) for c in names},
        "encode_ms": {c: statistics.median(enc_ms[c]) for c in names},
        "decode_ms": {c: statistics.median(dec_ms[c]) for c in names},
    }


def ratios(row: dict[str, Any]) -> dict[str, float]:
    b, e, d = row["bytes"], row["encode_ms"], row["decode_ms"]
    return {
        "u8_over_h264_size": b["raw"] / b["h264"],
        "h264_over_zlib6_size": b["h264"] / b["zlib6"],
        "h264_over_lzma6_size": b["h264"] / b["lzma6"],
        "h264_over_zlib6_encode": e["h264"] / e["zlib6"],
        "h264_over_zlib6_decode": d["h264"] / d["zlib6"],
        "h264_over_lzma6_encode": e["h264"] / e["lzma6"],
    }


def geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def _kb(n: float) -> str:
    return f"{n / 1024:.1f}"


SIZE_HEAD = (
    f"{'model':<18} {'k':>3} {'shape':<13} {'f32':>7} {'u8':>7} {'h264':>7} {'zlib1':>7} "
    f"{'zlib6':>7} {'lzma0':>7} {'lzma6':>7} {'u8/h264':>7} {'h/zlib6':>7} {'h/lzma6':>7}"
)
TIME_HEAD = (
    f"{'model':<18} {'k':>3} "
    + " ".join(f"{c + ' e/d':>13}" for c in CODECS)
    + f" {'h/z6 enc':>8} {'h/z6 dec':>8}"
)


def size_line(model: str, k: int, shape: tuple[int, ...], row: dict[str, Any]) -> str:
    b, r = row["bytes"], ratios(row)
    return (
        f"{model:<18} {k:>3} {'x'.join(map(str, shape)):<13} {_kb(row['f32_bytes']):>7} "
        + " ".join(f"{_kb(b[c]):>7}" for c in CODECS)
        + f" {r['u8_over_h264_size']:>7.2f} {r['h264_over_zlib6_size']:>7.2f}"
        f" {r['h264_over_lzma6_size']:>7.2f}"
    )


def time_line(model: str, k: int, row: dict[str, Any]) -> str:
    e, d, r = row["encode_ms"], row["decode_ms"], ratios(row)
    return (
        f"{model:<18} {k:>3} "
        + " ".join(f"{f'{e[c]:.2f}/{d[c]:.2f}':>13}" for c in CODECS)
        + f" {r['h264_over_zlib6_encode']:>8.2f} {r['h264_over_zlib6_decode']:>8.2f}"
    )


def summary_line(model: str, rows: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """Geometric means of the ratios over all of the model's splits, and over its spatial maps
    only (a flattened vector is one 1 x L plane, where H.264 does worst)."""
    spatial = [r for r in rows if len(r["shape"]) >= 2]
    g = {key: geomean([ratios(r)[key] for r in rows]) for key in ratios(rows[0])}
    gs = {key: geomean([ratios(r)[key] for r in spatial]) for key in g} if spatial else {}

    def part(m: dict[str, float]) -> str:
        return (
            f"uint8/h264 size {m['u8_over_h264_size']:.2f}, h264/zlib6 size "
            f"{m['h264_over_zlib6_size']:.2f}, h264/lzma6 size {m['h264_over_lzma6_size']:.2f}; "
            f"h264/zlib6 time encode {m['h264_over_zlib6_encode']:.2f}, decode "
            f"{m['h264_over_zlib6_decode']:.2f}; h264/lzma6 encode "
            f"{m['h264_over_lzma6_encode']:.2f}"
        )

    line = f"{model} (geometric means) all {len(rows)} splits: {part(g)}"
    if gs and len(spatial) < len(rows):
        line += f"\n{'':<{len(model)}} spatial maps only ({len(spatial)}): {part(gs)}"
    return line, {"all_splits": g, "spatial_maps": gs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--frames", type=int, default=4, help="video frames per split")
    ap.add_argument("--every", type=int, default=250, help="take every N-th frame of the clip")
    ap.add_argument("--repeats", type=int, default=3, help="timed repetitions per frame")
    ap.add_argument("--splits", type=int, default=5, help="split points per model; 0 = all")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--json-out", nargs="?", const=DEFAULT_JSON, default=None, metavar="FILE",
        help=f"write the results as JSON (to {DEFAULT_JSON} when no FILE is given)",
    )  # fmt: skip
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    frames = video_frames(limit=args.frames, every=args.every)
    table = codecs()
    overhead = len(encode_features(torch.zeros(1, 1), 0, "h264").data)
    print(
        f"feature-map codecs on real maps ({len(frames)} video frames x {args.repeats} repeats, "
        f"{args.threads} threads): sizes in KB (mean per sample); times in ms (median, "
        f"encode/decode, float map to float map); h = h264, z6 = zlib6; an h264 payload of a "
        f"1x1 map takes {overhead} bytes (headers and one macroblock)"
    )
    rows: list[dict[str, Any]] = []
    summaries: dict[str, dict[str, Any]] = {}
    lines: list[str] = []
    times: list[str] = []
    print(SIZE_HEAD, flush=True)
    for name in args.models.split(","):
        model = load_model(name)
        x = torch.stack([rgb_tensor(f, model.spec) for f in frames])
        model_rows = []
        for k in splits(len(model.stages), args.splits):
            h = model.run(x, 0, k)
            assert isinstance(h, torch.Tensor)
            maps = [m.contiguous() for m in h.unbind(0)]
            row = measure(maps, args.repeats, table)
            shape = tuple(maps[0].shape)
            row |= {"model": name, "split": k, "shape": list(shape), "ratios": ratios(row)}
            row["real_weights"] = name in REAL_WEIGHTS
            model_rows.append(row)
            print(size_line(name, k, shape, row), flush=True)
            times.append(time_line(name, k, row))
        line, summaries[name] = summary_line(name, model_rows)
        lines.append(line)
        rows += model_rows
    print()
    print(TIME_HEAD)
    print("\n".join(times))
    print()
    print("summary (ratios < 1: h264 smaller / faster)")
    print("\n".join(lines))
    if args.json_out:
        out = Path(args.json_out)
        out.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "bench": "feature_codec",
            "settings": {
                "models": args.models.split(","),
                "frames": len(frames),
                "every": args.every,
                "repeats": args.repeats,
                "splits": args.splits,
                "threads": args.threads,
            },
            "machine": {
                "python": platform.python_version(),
                "torch": torch.__version__,
                "av": av.__version__,
                "processor": platform.machine(),
            },
            "units": {"bytes": "mean per sample", "encode_ms": "median", "decode_ms": "median"},
            "rows": rows,
            "summary": summaries,
            "summary_lines": "\n".join(lines).splitlines(),
            "h264_bytes_of_a_1x1_map": overhead,
        }
        out.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
