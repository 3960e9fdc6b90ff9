"""KServe v2 tensors in and out, as JSON numbers or as binary data (Triton's `binary_tensor_data`
extension, which `tritonclient.http` uses by default).

With binary data a body is a JSON header of `Inference-Header-Content-Length` bytes followed by
each binary tensor's bytes in the order of the tensors that declare `binary_data_size` in their
`parameters` (row-major, little-endian; BYTES elements as a 4-byte little-endian length and the
bytes). A request asks for binary outputs per output (`outputs[i].parameters.binary_data`) or for
all outputs it does not name (`parameters.binary_data_output`); tritonclient asks for them unless
told otherwise.
"""

from __future__ import annotations

import math
import reprlib
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from scheduler.validate import is_int
from server.errors import BadRequest

HEADER_LENGTH = "Inference-Header-Content-Length"


def split_body(raw: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    """The JSON header and the binary data after it; all of `raw` is the header when the request
    declares no header length."""
    if header_length is None:
        return raw, b""
    length = header_length.strip()
    if not (length.isdigit() and int(length) <= len(raw)):
        raise BadRequest(
            400,
            f"{HEADER_LENGTH}: expected the JSON header's length in bytes, at most the body's "
            f"{len(raw)}, got {reprlib.repr(header_length)}",
        )
    return raw[: int(length)], raw[int(length) :]


def input_tensor(inp: Any, binary: bytes, shape: tuple[int, ...], max_samples: int) -> torch.Tensor:
    """The request's one FP32 input as [N, *shape], from its JSON `data` or from `binary` (the
    body after the JSON header), checked against the app's input shape and the queue's room."""
    if not isinstance(inp, dict) or inp.get("datatype") != "FP32":
        got = inp.get("datatype") if isinstance(inp, dict) else None
        raise BadRequest(400, f"inputs[0].datatype: expected FP32, got {reprlib.repr(got)}")
    declared = inp.get("shape")
    if not isinstance(declared, list) or not all(is_int(v) and v > 0 for v in declared):
        raise BadRequest(400, "inputs[0].shape: expected a list of positive integers")
    if declared == list(shape):
        declared = [1, *declared]
    if declared[1:] != list(shape):
        raise BadRequest(
            422,
            f"inputs[0].shape: expected [N, {', '.join(map(str, shape))}], "
            f"got {reprlib.repr(declared)}",
        )
    if declared[0] > max_samples:
        raise BadRequest(
            422,
            f"inputs[0].shape: expected at most {max_samples} samples (the server's queue), "
            f"got {reprlib.repr(declared[0])}",
        )
    params = inp.get("parameters") or {}
    if not isinstance(params, dict):
        raise BadRequest(400, "inputs[0].parameters: expected an object")
    if "binary_data_size" in params:
        if "data" in inp:
            raise BadRequest(
                400, "inputs[0]: expected either data or parameters.binary_data_size, not both"
            )
        arr = _binary_fp32(params["binary_data_size"], binary, declared)
    else:
        if binary:
            raise BadRequest(
                400,
                f"body: {len(binary)} bytes of binary data follow the JSON header, but no input "
                "declares parameters.binary_data_size",
            )
        arr = _json_fp32(inp.get("data"), declared)
    if not np.isfinite(arr).all():
        raise BadRequest(422, "inputs[0].data: expected finite numbers (within float32's range)")
    return torch.from_numpy(arr)


def _binary_fp32(size: Any, binary: bytes, declared: list[int]) -> np.ndarray:
    expected = 4 * math.prod(declared)
    if not (is_int(size) and size == expected):
        raise BadRequest(
            400,
            f"inputs[0].parameters.binary_data_size: expected {expected} (FP32 {declared}), "
            f"got {reprlib.repr(size)}",
        )
    if len(binary) != expected:
        raise BadRequest(
            400,
            f"body: expected {expected} bytes of binary data after the JSON header, "
            f"got {len(binary)}",
        )
    return np.frombuffer(binary, dtype="<f4").astype(np.float32).reshape(declared)


def _json_fp32(data: Any, declared: list[int]) -> np.ndarray:
    numbers = f"inputs[0].data: expected {math.prod(declared)} numbers for shape {declared}"
    # flat, or nested by the first dimension: counted before numpy walks it (16M nested lists
    # held the event loop for 4.3 s)
    if not isinstance(data, list) or len(data) not in (math.prod(declared), declared[0]):
        raise BadRequest(400, numbers)
    try:
        given = np.asarray(data)
        if given.dtype.kind not in "iuf":  # strings, booleans, ints too large: not numbers
            raise BadRequest(400, numbers)
        with np.errstate(over="ignore"):
            return given.astype(np.float32).reshape(declared)
    except (TypeError, ValueError):
        raise BadRequest(400, numbers) from None


@dataclass(frozen=True)
class Output:
    """An output tensor of `shape`: FP32 numbers, or strings in row-major order (BYTES: a
    detector's JSON, one a sample, or a classifier's best classes)."""

    name: str
    datatype: str
    shape: list[int]
    values: np.ndarray | list[str]

    def encode(self, binary: bool) -> tuple[dict[str, Any], bytes]:
        """Its entry in the reply's `outputs` and the binary data that follows the header
        (empty when the data are JSON)."""
        entry: dict[str, Any] = {"name": self.name, "datatype": self.datatype, "shape": self.shape}
        if not binary:
            values = self.values
            entry["data"] = values.flatten().tolist() if isinstance(values, np.ndarray) else values
            return entry, b""
        if isinstance(self.values, np.ndarray):
            blob = self.values.astype("<f4").tobytes()
        else:
            blob = b"".join(
                struct.pack("<I", len(b)) + b for b in (t.encode() for t in self.values)
            )
        entry["parameters"] = {"binary_data_size": len(blob)}
        return entry, blob


@dataclass(frozen=True)
class Requested:
    """How the request wants its output: as binary data or JSON, and as the top `classes`
    classes (Triton's classification extension: BYTES "value:index:label", best first) or, with
    0, as the tensor itself."""

    binary: bool
    classes: int


def requested(doc: dict[str, Any], output_name: str) -> Requested:
    """What the request asks of `output_name`; BadRequest(400) when it names another output or
    asks in a form not understood."""
    params = doc.get("parameters")
    default = isinstance(params, dict) and params.get("binary_data_output") is True
    asked = doc.get("outputs")
    if asked is None:
        return Requested(default, 0)
    if not isinstance(asked, list) or not asked:
        raise BadRequest(400, f"outputs: expected a list naming {output_name!r}, or no outputs")
    binary, classes = default, 0
    for i, out in enumerate(asked):
        name = out.get("name") if isinstance(out, dict) else None
        if name != output_name:
            raise BadRequest(
                400, f"outputs[{i}].name: expected {output_name!r}, got {reprlib.repr(name)}"
            )
        params = out.get("parameters") or {}
        if not isinstance(params, dict):
            raise BadRequest(400, f"outputs[{i}].parameters: expected an object")
        classes = params.get("classification", 0)
        if not (is_int(classes) and classes >= 0):
            raise BadRequest(
                400,
                f"outputs[{i}].parameters.classification: expected a number of classes (0 for "
                f"the tensor itself), got {reprlib.repr(classes)}",
            )
        binary = params.get("binary_data", binary) is True
    return Requested(binary, int(classes))


def top_classes(scores: np.ndarray, classes: int, labels: tuple[str, ...]) -> list[str]:
    """Each sample's `classes` best classes (at most as many as there are), best first, as
    Triton's classification extension writes them: "value:index:label" ("value:index" for a
    class without a label), row after row for an [N, classes] BYTES tensor."""
    k = min(classes, scores.shape[1])
    out = []
    for row in scores:
        for i in np.argsort(-row, kind="stable")[:k]:
            label = f":{labels[i]}" if i < len(labels) else ""
            out.append(f"{row[i]:f}:{i}{label}")
    return out
