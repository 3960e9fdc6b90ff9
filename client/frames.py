"""Real camera frames: decoded from a video file with PyAV, sent as JPEG (OpenCV)."""

from __future__ import annotations

from pathlib import Path

import av
import cv2
import numpy as np

BUNDLED_VIDEO = (
    Path(__file__).resolve().parent.parent
    / "traces"
    / "data"
    / "video"
    / "intel_bottle-detection.mp4"
)


def video_frames(
    path: str | Path = BUNDLED_VIDEO, limit: int | None = None, every: int = 1
) -> list[np.ndarray]:
    """RGB frames (H x W x 3 uint8) of the video, every `every`-th, at most `limit`."""
    out: list[np.ndarray] = []
    try:
        with av.open(str(path), mode="r") as container:
            for i, frame in enumerate(container.decode(video=0)):
                if i % every == 0:
                    out.append(frame.to_ndarray(format="rgb24"))
                    if limit is not None and len(out) >= limit:
                        break
    except (av.error.FFmpegError, OSError) as exc:
        raise ValueError(f"{path}: expected a readable video file ({exc})") from None
    if not out:
        raise ValueError(f"{path}: expected a video with at least one frame")
    return out


def jpeg(rgb: np.ndarray, quality: int = 90) -> bytes:
    ok, buf = cv2.imencode(
        ".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, quality]
    )
    if not ok:
        raise ValueError("could not encode a frame as JPEG")
    return buf.tobytes()


BUNDLED_IMAGES = Path(__file__).resolve().parent.parent / "traces" / "data" / "images"
PHOTO_SUFFIXES = (".png", ".jpg", ".jpeg")


def bundled_photos(folder: str | Path = BUNDLED_IMAGES) -> dict[str, np.ndarray]:
    """The photos in `folder` (the bundled scikit-image ones by default) as RGB arrays
    (H x W x 3 uint8), keyed by file name, in name order."""
    out: dict[str, np.ndarray] = {}
    for path in sorted(Path(folder).iterdir()) if Path(folder).is_dir() else []:
        if path.suffix.lower() in PHOTO_SUFFIXES:
            bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
            if bgr is None:
                raise ValueError(f"{path}: expected a readable image file")
            out[path.name] = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    if not out:
        raise ValueError(f"{folder}: expected a folder with at least one PNG or JPEG photo")
    return out
