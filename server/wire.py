"""The wire format of /v1/infer and /v1/stream: msgpack (primary) or JSON (bytes as base64).

    {"app": "resnet18", "deadline_ms": 150, "payload": {"jpeg": <bytes>}}
    {"app": ..., "payload": {"features": {"position": 4, "shape": [C, H, W], "scale": s,
                                          "zero_point": z, "codec": "h264"|"raw", "data": <bytes>}}}
    optional: "request_id", "client_id"

`parse_infer` checks every field and raises BadRequest naming the first wrong one (400 for a
malformed body or a missing or mistyped field, 404 for an unknown app, 422 for values that are
well-formed but unusable: a position outside the app, an absurd deadline).
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import math
import reprlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

from scheduler.validate import is_int, is_number
from server.errors import BadRequest

MSGPACK = "application/msgpack"
JSON = "application/json"
MSGPACK_TYPES = (MSGPACK, "application/x-msgpack", "")  # "": a body sent with no Content-Type
# items in one msgpack array or map, and values in a JSON document: an infer message has a
# handful; 16M empty arrays in a msgpack body held the event loop for 5.8 s before this
MAX_ITEMS = 1024
MAX_DEADLINE_MS = 600_000.0  # ten minutes: beyond that a "deadline" is a mistake
# an INT8 step of 1e6 spans activations up to 2.55e8; larger ones overflow a layer's float32
# sums to infinity and the answer to NaN
MAX_FEATURE_SCALE = 1e6


@dataclass(frozen=True)
class InferRequest:
    app: str
    deadline_ms: float
    request_id: str | None
    client_id: str | None
    jpeg: bytes | None = None
    features: Mapping[str, Any] | None = None
    tensor: Any = None  # an already-decoded input for stage 0 (KServe v2 tensors)

    @property
    def position(self) -> int:
        return 0 if self.features is None else int(self.features["position"])


def is_json(content_type: str) -> bool:
    return content_type.split(";")[0].strip().lower() == JSON


def is_msgpack(content_type: str) -> bool:
    return content_type.split(";")[0].strip().lower() in MSGPACK_TYPES


def decode_body(raw: bytes, content_type: str, max_json_values: int = MAX_ITEMS) -> Any:
    """The decoded document; BadRequest(400) if it is not valid msgpack / JSON (a number JSON
    cannot convert and nesting too deep to parse included) or a JSON document holds more than
    `max_json_values` values (counted as its commas, before it is parsed), 415 for another
    Content-Type."""
    kind = content_type.split(";")[0].strip().lower()
    if kind == JSON:
        # json's parser holds the event loop (and the GIL) while it runs: 16 MB of empty arrays
        # took 1.0 s; counting their commas takes 5 ms
        if (commas := raw.count(b",")) >= max_json_values:
            raise BadRequest(
                400,
                f"body: expected a JSON document of at most {max_json_values} values, got "
                f"{commas} commas",
            )
        try:
            return json.loads(raw)
        except (ValueError, RecursionError) as exc:  # ValueError: JSONDecodeError, 4300+ digits
            raise BadRequest(400, f"body: expected a JSON document ({_why(exc)})") from None
    if kind in MSGPACK_TYPES:
        try:
            return msgpack.unpackb(raw, raw=False, max_array_len=MAX_ITEMS, max_map_len=MAX_ITEMS)
        except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
            raise BadRequest(400, f"body: expected a msgpack document ({_why(exc)})") from None
    raise BadRequest(415, f"Content-Type: expected {MSGPACK} or {JSON}, got {kind!r}")


def _why(exc: BaseException) -> str:
    """An exception's message, or its type where it has none (msgpack's often have none)."""
    text = str(exc)
    return text[:200] if text else type(exc).__name__


def finite(x: int | float) -> bool:
    """Whether `x` is a finite number as a float (an int too large for a float is not)."""
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


def fresh_id(counter: itertools.count[int], in_use: Callable[[str], bool]) -> str:
    """The next automatic request id, "r<n>", that no request in flight holds (a client may
    have chosen that id for its own); ids are unique among the requests in flight only."""
    while in_use(rid := f"r{next(counter)}"):
        pass
    return rid


def encode_body(doc: Any, json_mode: bool) -> tuple[bytes, str]:
    if json_mode:
        return json.dumps(doc).encode(), JSON
    return msgpack.packb(doc, use_bin_type=True), MSGPACK


def parse_infer(
    doc: Any, app_lengths: Mapping[str, int], json_mode: bool, default_deadline_ms: float
) -> InferRequest:
    """Check an infer message against the served apps (name -> number of stages)."""
    if not isinstance(doc, dict):
        raise BadRequest(400, "body: expected an object with app and payload")
    app = doc.get("app")
    if not isinstance(app, str) or not app:
        raise BadRequest(400, "app: expected the name of a served app (a string)")
    if app not in app_lengths:
        raise BadRequest(
            404, f"app: unknown app {app!r}; served apps: {', '.join(sorted(app_lengths))}"
        )
    deadline = doc.get("deadline_ms", default_deadline_ms)
    if not is_number(deadline):
        raise BadRequest(400, "deadline_ms: expected a number of milliseconds")
    if not (finite(deadline) and 0 < deadline <= MAX_DEADLINE_MS):
        raise BadRequest(
            422,
            f"deadline_ms: expected a number in (0, {MAX_DEADLINE_MS:g}], "
            f"got {reprlib.repr(deadline)}",
        )
    rid = _optional_str(doc, "request_id")
    cid = _optional_str(doc, "client_id")
    payload = doc.get("payload")
    if not isinstance(payload, dict) or ("jpeg" in payload) == ("features" in payload):
        raise BadRequest(400, "payload: expected an object with exactly one of jpeg or features")
    if "jpeg" in payload:
        jpeg = _bytes(payload["jpeg"], "payload.jpeg", json_mode)
        return InferRequest(app, float(deadline), rid, cid, jpeg=jpeg)
    f = payload["features"]
    if not isinstance(f, dict):
        raise BadRequest(400, "payload.features: expected an object")
    pos = f.get("position")
    if not is_int(pos):
        raise BadRequest(400, "payload.features.position: expected an integer stage index")
    if not 0 < pos < app_lengths[app]:
        raise BadRequest(
            422,
            f"payload.features.position: expected 1..{app_lengths[app] - 1} for app {app}, got {pos}",
        )
    shape = f.get("shape")
    if not isinstance(shape, list) or not shape or not all(is_int(v) and v > 0 for v in shape):
        raise BadRequest(400, "payload.features.shape: expected a list of positive integers")
    scale = f.get("scale")
    if not is_number(scale) or not (finite(scale) and 0 < scale <= MAX_FEATURE_SCALE):
        raise BadRequest(
            400, f"payload.features.scale: expected a positive number up to {MAX_FEATURE_SCALE:g}"
        )
    zp = f.get("zero_point")
    if not is_int(zp) or not 0 <= zp <= 255:
        raise BadRequest(400, "payload.features.zero_point: expected an integer in 0..255")
    codec = f.get("codec")
    if not isinstance(codec, str):
        raise BadRequest(400, 'payload.features.codec: expected "h264" or "raw"')
    data = _bytes(f.get("data"), "payload.features.data", json_mode)
    features = {
        "position": pos,
        "shape": shape,
        "scale": float(scale),
        "zero_point": zp,
        "codec": codec,
        "data": data,
    }
    return InferRequest(app, float(deadline), rid, cid, features=features)


def _optional_str(doc: Mapping[str, Any], key: str) -> str | None:
    v = doc.get(key)
    if v is None:
        return None
    if not isinstance(v, str) or not v or len(v) > 200 or not _utf8(v):
        raise BadRequest(400, f"{key}: expected a string of 1 to 200 characters (Unicode text)")
    return v


def _utf8(text: str) -> bool:
    """False for a string no answer could carry (a lone surrogate, which JSON's \\ud800 allows)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _bytes(v: object, field: str, json_mode: bool) -> bytes:
    if json_mode:
        if not isinstance(v, str):
            raise BadRequest(400, f"{field}: expected base64 text (JSON carries bytes as base64)")
        try:
            return base64.b64decode(v, validate=True)
        except (binascii.Error, ValueError):
            raise BadRequest(400, f"{field}: expected valid base64") from None
    if not isinstance(v, bytes | bytearray):
        raise BadRequest(400, f"{field}: expected bytes")
    return bytes(v)
