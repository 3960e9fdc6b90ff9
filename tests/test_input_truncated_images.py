"""An image cut off in transit (a camera's upload whose link dropped: only the first part of the
file arrives) is refused 422 with one sentence that says so, before it is decoded. A decoder
need not refuse it: OpenCV 4's libjpeg fills a cut-off JPEG's missing rows with grey and says
nothing, and the server would classify the half-grey picture as if nothing were wrong.

The check is `server.inputs._header`'s: a JPEG is complete only if an end-of-image marker
(FF D9) follows its first start-of-scan; a PNG only if it holds its IEND chunk. An EXIF
thumbnail's own end-of-image marker, before the main scan, must not count, and bytes after
the end (which OpenCV takes) are not refused. The images are real: a bundled photo
(scikit-image's "chelsea", 640 x 480) encoded by OpenCV."""

from __future__ import annotations

import functools
import json
from typing import Any

import cv2
import numpy as np
import pytest
import torch

from client.frames import BUNDLED_IMAGES
from layerexec.zoo import spec as model_spec
from server.errors import BadRequest
from server.inputs import encoded_size, image_tensor
from tests.server_cases import (
    CIFAR,
    FACES,
    StageGate,
    build,
    counters,
    good_request_in_flight,
    infer,
    infer_doc,
    jpeg,
    json_doc,
    post,
    restore_process_globals,  # noqa: F401 (a fixture)
    serve,
)

pytestmark = pytest.mark.usefixtures("restore_process_globals")

SOI, EOI, SOS = b"\xff\xd8", b"\xff\xd9", b"\xff\xda"
CUTS = [0.3, 0.6, 0.9, -2, -1]  # a fraction of the bytes kept, or bytes taken off the end


@functools.cache
def photo() -> np.ndarray:
    """A real photo, RGB, 640 x 480."""
    bgr = cv2.imread(str(BUNDLED_IMAGES / "skimage_chelsea.png"), cv2.IMREAD_COLOR)
    assert bgr is not None
    return cv2.cvtColor(
        cv2.resize(bgr, (640, 480), interpolation=cv2.INTER_AREA), cv2.COLOR_BGR2RGB
    )


def cut(data: bytes, at: float) -> bytes:
    """The first `at` of `data` (a fraction), or all but its last `-at` bytes."""
    return data[: int(len(data) * at)] if at > 0 else data[: int(at)]


def segment(marker: int, body: bytes) -> bytes:
    """A JPEG marker segment: FF, the marker, a length that counts itself, the body."""
    return bytes([0xFF, marker]) + (len(body) + 2).to_bytes(2, "big") + body


def with_exif_thumbnail(frame: bytes, thumbnail: bytes) -> bytes:
    """`frame` with an EXIF APP1 segment after its SOI whose IFD1 points at `thumbnail`, a
    complete JPEG of its own (as cameras write them)."""
    # TIFF, big-endian: IFD0 with no entries at 8, IFD1 at 14 with the thumbnail's offset and
    # length (each a LONG), the thumbnail after it at 44
    ifd0 = (0).to_bytes(2, "big") + (14).to_bytes(4, "big")
    entries = [(0x0201, 44), (0x0202, len(thumbnail))]
    ifd1 = len(entries).to_bytes(2, "big")
    for tag, value in entries:
        ifd1 += tag.to_bytes(2, "big") + (4).to_bytes(2, "big") + (1).to_bytes(4, "big")
        ifd1 += value.to_bytes(4, "big")
    ifd1 += (0).to_bytes(4, "big")
    tiff = b"MM\x00\x2a" + (8).to_bytes(4, "big") + ifd0 + ifd1
    assert len(tiff) == 44
    return SOI + segment(0xE1, b"Exif\x00\x00" + tiff + thumbnail) + frame[2:]


def refusal(data: bytes, spec: str = CIFAR) -> BadRequest:
    with pytest.raises(BadRequest) as info:
        image_tensor(data, model_spec(spec))
    assert info.value.status == 422
    return info.value


def cut_jpeg_message(data: bytes) -> str:
    return (
        f"payload.jpeg: expected a complete JPEG, got {len(data)} bytes that end before its "
        "end-of-image marker (the image was cut off)"
    )


def cut_png_message(data: bytes) -> str:
    return (
        f"payload.jpeg: expected a complete PNG, got {len(data)} bytes that end before its "
        "IEND chunk (the image was cut off)"
    )


# --- JPEG ---------------------------------------------------------------------------------------
def progressive(rgb: np.ndarray) -> bytes:
    bgr = cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)
    return bytes(cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])[1])


def restarts(rgb: np.ndarray) -> bytes:
    """Restart markers (FF D0-D7) in its entropy-coded data, every 4 MCUs."""
    bgr = cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)
    return bytes(cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_RST_INTERVAL, 4])[1])


ENCODINGS = {"baseline": jpeg, "progressive": progressive, "restart markers": restarts}


@pytest.mark.parametrize("encoding", list(ENCODINGS))
def test_a_complete_jpeg_is_accepted(encoding: str) -> None:
    frame = ENCODINGS[encoding](photo())
    for name in (CIFAR, FACES):
        assert tuple(image_tensor(frame, model_spec(name)).shape) == model_spec(name).input_shape


@pytest.mark.parametrize("at", CUTS)
@pytest.mark.parametrize("encoding", list(ENCODINGS))
def test_a_cut_off_jpeg_is_refused_with_a_sentence_that_says_so(encoding: str, at: float) -> None:
    frame = ENCODINGS[encoding](photo())
    data = cut(frame, at)
    assert encoded_size(data) == (640, 480)  # the header arrived: the size check passes it
    assert refusal(data).message == cut_jpeg_message(data)


def test_a_jpeg_cut_in_its_header_is_refused() -> None:
    frame = jpeg(photo())
    sos = frame.index(SOS)
    for end in (sos + 1, sos + 5, frame.index(b"\xff\xc4")):  # in the scan header, in a table
        data = frame[:end]
        assert refusal(data).message == cut_jpeg_message(data)


def test_the_thumbnails_end_of_image_does_not_make_a_cut_off_jpeg_whole() -> None:
    thumbnail = jpeg(cv2.resize(photo(), (160, 120), interpolation=cv2.INTER_AREA))
    frame = with_exif_thumbnail(jpeg(photo()), thumbnail)
    thumbnail_end = frame.index(EOI) + 2  # the thumbnail's, in the APP1 segment
    main_scan = frame.index(SOS, thumbnail_end)
    assert main_scan < thumbnail_end + 1000  # the main image's tables, then its scan
    for at in CUTS:
        data = cut(frame, at)
        assert len(data) > main_scan and EOI in data  # cut in the main scan, after an EOI
        assert refusal(data).message == cut_jpeg_message(data)


def test_a_complete_jpeg_with_an_exif_thumbnail_is_accepted_as_the_main_image() -> None:
    thumbnail = jpeg(cv2.resize(photo(), (160, 120), interpolation=cv2.INTER_AREA))
    plain = jpeg(photo())
    frame = with_exif_thumbnail(plain, thumbnail)
    assert encoded_size(frame) == (640, 480)
    for name in (CIFAR, FACES):
        spec = model_spec(name)
        assert torch.equal(image_tensor(frame, spec), image_tensor(plain, spec))


def test_bytes_after_the_end_of_image_are_accepted() -> None:
    plain = jpeg(photo())
    spec = model_spec(FACES)
    expected = image_tensor(plain, spec)
    # padding, text, and a stray FF D8 / FF D9 pair in the trailer
    for trailer in (b"\x00" * 100, b"uploaded by cam-7\n", b"\xff\xd8\x00\xff\xd9\x00"):
        assert torch.equal(image_tensor(plain + trailer, spec), expected)


def test_many_markers_before_the_scan_neither_hide_a_cut_nor_refuse_a_whole_image() -> None:
    """The header walk stops after _MAX_MARKERS markers (a bound on a hostile header's cost):
    2000 empty comments after the frame header, and the image is still told whole or cut off.
    Before the frame header, so many markers are refused as a header that does not say."""
    plain = jpeg(photo())
    sof = plain.index(b"\xff\xc0")
    sof_end = sof + 2 + int.from_bytes(plain[sof + 2 : sof + 4], "big")
    comments = segment(0xFE, b"") * 2000
    frame = plain[:sof_end] + comments + plain[sof_end:]
    spec = model_spec(FACES)
    assert torch.equal(image_tensor(frame, spec), image_tensor(plain, spec))
    data = cut(frame, 0.9)
    assert refusal(data).message == cut_jpeg_message(data)
    early = SOI + comments + plain[2:]
    assert encoded_size(early) is None
    assert refusal(early).message == (
        "payload.jpeg: expected a JPEG or PNG image, could not decode a header of either"
    )


# --- PNG ----------------------------------------------------------------------------------------
def png(rgb: np.ndarray) -> bytes:
    return bytes(cv2.imencode(".png", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))[1])


def test_a_complete_png_is_accepted_and_a_cut_off_one_refused() -> None:
    frame = png(photo())
    spec = model_spec(FACES)
    assert tuple(image_tensor(frame, spec).shape) == spec.input_shape
    assert torch.equal(image_tensor(frame + b"trailing", spec), image_tensor(frame, spec))
    for at in [*CUTS, -12, -13]:  # -12: all but its IEND chunk
        data = cut(frame, at)
        assert encoded_size(data) == (640, 480)
        assert refusal(data, FACES).message == cut_png_message(data)


# --- over the server ----------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_the_server_answers_a_cut_off_jpeg_422_and_serves_on(aiohttp_client: Any) -> None:
    """The cut-off upload gets 422 and its sentence in JSON, a valid request in flight beside it
    is served, and so is a valid request sent right after it."""
    runtime = build()
    client = await serve(aiohttp_client, runtime)
    frame = jpeg(photo())
    data = cut(frame, 0.6)
    with StageGate(runtime, CIFAR, 1) as gate:
        async with good_request_in_flight(client, gate):
            status, doc, headers = await post(
                client, json.dumps(json_doc(data)).encode(), "application/json"
            )
            assert headers["Content-Type"].startswith("application/json")
            assert (status, doc) == (422, {"status": 422, "error": cut_jpeg_message(data)})
    status, answer = await infer(client, infer_doc(frame, request_id="after"))
    assert (status, answer["status"], answer["request_id"]) == (200, "ok", "after")
    assert len(answer["result"]["top5"]) == 5
    assert counters(runtime) == {f"{CIFAR}/ok": 2}
