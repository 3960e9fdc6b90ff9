"""The work every server in bench/peers.py does for one request, shared by the peers' handlers.

A JPEG is decoded and resized by layerbatch's own server code (server/inputs.py `image_tensor`:
`cv2.imdecode`, resize INTER_LINEAR to the model's input, BGR -> RGB, normalise per channel), the
model is the one `layerexec.zoo.load_model` builds (the torchvision definition under the same
seed, so the same weights; only with PEERS_FOLD_BN=1 as layerbatch's loader prepares it: its
batch norms folded into the convolutions and its 1x1 convolutions run on oneDNN at every batch
size, `layerexec.pointwise`), in channels-last memory format as layerbatch's executor runs it,
under `torch.inference_mode()` with 2 intra-op threads, loaded and run on one thread as
layerbatch's are (`Model`); the answer is the top-5 classes with their softmax scores, as
layerbatch answers a classifier.

Runs in the peers' venv (.venv-peers) with the repository root on sys.path; imports no peer.

    .venv-peers/bin/python bench/peers_model.py --bound resnet18   # the compute bound, as JSON
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.fx.experimental.optimization import fuse  # noqa: E402

from layerexec.allocator import keep_freed_memory, reserve_heap  # noqa: E402
from layerexec.pointwise import route_pointwise_convs  # noqa: E402
from layerexec.torch_thread import TorchThread  # noqa: E402
from layerexec.zoo import DEFAULT_SEED, spec  # noqa: E402
from scheduler.profile import load_profile  # noqa: E402
from server.build import BUNDLED_PROFILES  # noqa: E402
from server.inputs import image_tensor  # noqa: E402

P = ParamSpec("P")
T = TypeVar("T")
THREADS = int(os.environ.get("PEERS_TORCH_THREADS", "2"))
# bench/peers.py --fold-peers: the peers serve the model as layerbatch's loader prepares it by
# default (batch norms folded into the convolutions, 1x1 convolutions on oneDNN)
FOLD_BN = os.environ.get("PEERS_FOLD_BN", "0") == "1"


class Model:
    """One model, ready to serve batches of JPEGs. With `own_thread` it is loaded, warmed up and
    run on a thread of its own (`thread`), whichever thread calls `infer`, `classify` or
    `forward`, as layerbatch's server does: torch work on a second thread slows every forward
    (layerexec/torch_thread.py). A server that calls its handler on the thread that loaded the
    model (TorchServe's worker) needs none; one that calls it from another (PyTriton, Ray Serve's
    `asyncio.to_thread`) does."""

    def __init__(
        self,
        name: str,
        seed: int = DEFAULT_SEED,
        threads: int = THREADS,
        channels_last: bool = True,
        warm_batches: tuple[int, ...] = (1,),
        fold_batch_norm: bool = FOLD_BN,
        own_thread: bool = False,
    ) -> None:
        torch.set_num_threads(threads)
        keep_freed_memory()  # as layerbatch's server does: a process setting any server can use
        self.name = name
        self.spec = spec(name)
        self.channels_last = channels_last
        self.thread = TorchThread("peers-torch") if own_thread else None
        self.module = self._call(self._load, seed, fold_batch_norm, warm_batches)

    def _call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return fn(*args, **kwargs) if self.thread is None else self.thread.call(fn, *args, **kwargs)

    def _load(self, seed: int, fold_batch_norm: bool, warm_batches: tuple[int, ...]) -> Any:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            module = self.spec.build().eval()
        if fold_batch_norm:
            module = fuse(module)
            route_pointwise_convs(module)
        if self.channels_last:
            module.to(memory_format=torch.channels_last)
        with torch.inference_mode():
            for b in sorted(set(warm_batches)):
                for _ in range(2):
                    module(self._layout(torch.zeros(b, *self.spec.input_shape)))
        # the heap room layerbatch's server leaves (server/build.py `warm_up`)
        profile = load_profile(BUNDLED_PROFILES / f"{self.name}-cpu.json")
        reserve_heap(2 * profile.peak_bytes * max(warm_batches))
        return module

    def _layout(self, x: torch.Tensor) -> torch.Tensor:
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x

    def decode(self, jpeg: bytes) -> torch.Tensor:
        """(C, H, W) float32: layerbatch's own server/inputs.py `image_tensor`."""
        return image_tensor(jpeg, self.spec)

    def forward(self, x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """Top-5 (classes, scores) per row of a batch (N, C, H, W)."""
        return self._call(self._forward, x)

    def _forward(self, x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        with torch.inference_mode():
            logits = self.module(self._layout(x))
            scores, classes = torch.softmax(logits, dim=1).topk(5, dim=1)
        return classes.numpy(), scores.numpy()

    def classify(self, jpegs: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        """Decode, batch and run `jpegs` on the model's thread: top-5 (classes, scores) each."""
        return self._call(self._classify, jpegs)

    def _classify(self, jpegs: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        return self._forward(torch.stack([self.decode(j) for j in jpegs]))

    def infer(self, jpegs: list[bytes]) -> list[dict[str, Any]]:
        classes, scores = self.classify(jpegs)
        return [
            {"classes": c.tolist(), "scores": [round(float(v), 5) for v in s]}
            for c, s in zip(classes, scores, strict=True)
        ]


def compute_bound(
    name: str,
    frames: list[bytes],
    repeats: int = 3,
    threads: int = THREADS,
    batches: tuple[int, ...] = (8, 16),
) -> dict[str, Any]:
    """Decode + batch-1 forward of every frame, `repeats` times, with `threads` torch threads,
    contiguous and channels-last; the faster layout is the plain server's bound. Also, in that
    layout, the median forward of a full batch of each size in `batches` (size -> forward_ms),
    of the model as the peers run it (`batched`) and with its batch norms folded as layerbatch
    runs it (`batched_folded`): with the decodes, about the most any server could do."""
    out: dict[str, Any] = {"model": name, "threads": threads, "frames": len(frames)}
    models = {}
    for layout, cl in (("contiguous", False), ("channels_last", True)):
        m = models[layout] = Model(name, threads=threads, channels_last=cl)
        dec, fwd = [], []
        for _ in range(repeats):
            for j in frames:
                t0 = time.perf_counter()
                x = m.decode(j).unsqueeze(0)
                t1 = time.perf_counter()
                m.forward(x)
                t2 = time.perf_counter()
                dec.append((t1 - t0) * 1000.0)
                fwd.append((t2 - t1) * 1000.0)
        out[layout] = {
            "decode_ms": round(statistics.median(dec), 3),
            "forward_ms": round(statistics.median(fwd), 3),
        }
    best = min(("contiguous", "channels_last"), key=lambda k: out[k]["forward_ms"])
    out["layout"] = best
    out["decode_ms"] = out[best]["decode_ms"]
    out["forward_ms"] = out[best]["forward_ms"]
    xs = torch.stack([models[best].decode(j) for j in frames])
    folded = Model(
        name, threads=threads, channels_last=best == "channels_last", fold_batch_norm=True
    )
    for key, m in (("batched", models[best]), ("batched_folded", folded)):
        out[key] = {}
        for b in batches:
            x = xs[torch.arange(b) % len(xs)]
            m.forward(x)  # warm-up at this size
            times = []
            for _ in range(repeats + 1):
                t0 = time.perf_counter()
                m.forward(x)
                times.append((time.perf_counter() - t0) * 1000.0)
            out[key][str(b)] = round(statistics.median(times), 3)
    return out


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--bound", required=True, help="model name")
    ap.add_argument("--frames", required=True, help="a .npz of JPEG frames (bench/peers.py)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with np.load(args.frames) as z:
        frames = [bytes(z[k]) for k in sorted(z.files)]
    print(json.dumps(compute_bound(args.bound, frames, args.repeats)))


if __name__ == "__main__":
    main()
