"""Networks with real weights shipped in layerexec/nets/weights: strict loading, golden outputs,
real-image checks (when ../shared is present), torch.fx traceability and corrupt weights files.

The golden values were computed with torch 2.14.1 on CPU (float32) by running the shipped
weights on ``_synthetic`` inputs, the same code as in the tests below:
``load_resnet20()(_synthetic(2, 32, 32))`` and ``load_ultraface()(_synthetic(1, 240, 320))``.
Randomly initialised networks give entirely different values.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.fx
from torch import nn

from layerexec.nets.resnet20 import (
    CIFAR10_CLASSES,
    CIFAR_MEAN,
    CIFAR_STD,
    RESNET20_WEIGHTS,
    ResNet,
    load_resnet20,
    resnet20,
)
from layerexec.nets.ultraface import (
    IMAGE_MEAN,
    IMAGE_STD,
    NUM_PRIORS,
    ULTRAFACE_WEIGHTS,
    UltraFaceSlim,
    load_ultraface,
    ultraface_slim320,
)

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
CHELSEA = SHARED_DATA / "images" / "skimage_chelsea.png"
ASTRONAUT = SHARED_DATA / "images" / "skimage_astronaut.png"
ULTRAFACE_ONNX = SHARED_DATA / "weights" / "ultraface_version-slim-320.onnx"

RESNET20_GOLDEN = [
    [4.23805, -3.3161, 1.60831, 7.99084, -1.89942, -0.27023, 4.14575, -3.87584, -4.44451, -4.21453],
    [3.41036, -3.30289, 1.59101, 7.03986, -1.94389, 0.70542, 2.83288, -2.91182, -4.04194, -3.41523],
]
ULTRAFACE_GOLDEN_PRIORS = [0, 1234, 3600, 4200, 4419]
ULTRAFACE_GOLDEN_SCORES = [
    [0.894817, 0.105183],
    [0.89502, 0.10498],
    [0.903668, 0.096332],
    [0.929157, 0.070843],
    [0.972608, 0.027392],
]
ULTRAFACE_GOLDEN_BOXES = [
    [0.003771, -0.00035, 0.025205, 0.033716],
    [0.270151, 0.315711, 0.303458, 0.377921],
    [-0.016846, -0.021864, 0.071234, 0.105136],
    [-0.044715, -0.062389, 0.151287, 0.197174],
    [0.550623, 0.393014, 1.177426, 1.210543],
]
ULTRAFACE_GOLDEN_FACE_SCORE_SUM = 438.81506


def _synthetic(n: int, height: int, width: int) -> torch.Tensor:
    """A deterministic, smooth, image-like input ``(n, 3, height, width)`` in [-1.5, 1.5]."""
    c = torch.arange(3, dtype=torch.float64).view(1, 3, 1, 1)
    b = torch.arange(n, dtype=torch.float64).view(n, 1, 1, 1)
    y = torch.arange(height, dtype=torch.float64).view(1, 1, height, 1) / height
    x = torch.arange(width, dtype=torch.float64).view(1, 1, 1, width) / width
    return (1.5 * torch.sin(6.0 * y + 2.0 * c + b) * torch.cos(5.0 * x - 1.5 * c + 0.7 * b)).float()


def _read_rgb(path: Path, width: int, height: int) -> np.ndarray:
    cv2 = pytest.importorskip("cv2")
    bgr = cv2.imread(str(path))
    assert bgr is not None, f"{path}: could not read the image"
    rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    return np.asarray(cv2.resize(rgb, (width, height), interpolation=cv2.INTER_AREA))


@pytest.fixture(scope="module")
def resnet() -> ResNet:
    return load_resnet20()


@pytest.fixture(scope="module")
def ultraface() -> UltraFaceSlim:
    return load_ultraface()


def test_shipped_weights_and_licenses_exist() -> None:
    weights = RESNET20_WEIGHTS.parent
    for name in ["akamaster_LICENSE_BSD-2.txt", "ultraface_LICENSE_MIT.txt"]:
        assert (weights / name).stat().st_size > 500
    assert RESNET20_WEIGHTS.is_file() and ULTRAFACE_WEIGHTS.is_file()


def test_strict_loading_gives_eval_modules_with_every_key(
    resnet: ResNet, ultraface: UltraFaceSlim
) -> None:
    checkpoint = torch.load(RESNET20_WEIGHTS, map_location="cpu", weights_only=True)
    shipped = {k.removeprefix("module.") for k in checkpoint["state_dict"]}
    # The legacy checkpoint has no num_batches_tracked; batch norm supplies it.
    assert shipped == {k for k in resnet.state_dict() if not k.endswith("num_batches_tracked")}
    assert set(torch.load(ULTRAFACE_WEIGHTS, map_location="cpu", weights_only=True)) == set(
        ultraface.state_dict()
    )
    assert not resnet.training and not ultraface.training
    # Random networks load the real weights strictly too (the definitions match the files).
    resnet20().load_state_dict(resnet.state_dict(), strict=True)
    ultraface_slim320().load_state_dict(ultraface.state_dict(), strict=True)


def test_resnet20_golden_output(resnet: ResNet) -> None:
    with torch.inference_mode():
        logits = resnet(_synthetic(2, 32, 32))
    torch.testing.assert_close(logits, torch.tensor(RESNET20_GOLDEN), atol=1e-4, rtol=1e-4)


def test_ultraface_golden_output(ultraface: UltraFaceSlim) -> None:
    with torch.inference_mode():
        scores, boxes = ultraface(_synthetic(1, 240, 320))
    assert scores.shape == (1, NUM_PRIORS, 2) and boxes.shape == (1, NUM_PRIORS, 4)
    torch.testing.assert_close(scores.sum(dim=2), torch.ones(1, NUM_PRIORS))
    idx = ULTRAFACE_GOLDEN_PRIORS
    golden_scores = torch.tensor(ULTRAFACE_GOLDEN_SCORES)
    torch.testing.assert_close(scores[0, idx], golden_scores, atol=1e-4, rtol=1e-4)
    golden_boxes = torch.tensor(ULTRAFACE_GOLDEN_BOXES)
    torch.testing.assert_close(boxes[0, idx], golden_boxes, atol=1e-4, rtol=1e-4)
    assert scores[0, :, 1].sum().item() == pytest.approx(ULTRAFACE_GOLDEN_FACE_SCORE_SUM, rel=1e-5)


@pytest.mark.skipif(not CHELSEA.is_file(), reason=f"{CHELSEA} is absent (../shared not present)")
def test_resnet20_calls_chelsea_a_cat(resnet: ResNet) -> None:
    rgb = torch.from_numpy(_read_rgb(CHELSEA, 32, 32)).permute(2, 0, 1).float() / 255.0
    x = (rgb - torch.tensor(CIFAR_MEAN).view(3, 1, 1)) / torch.tensor(CIFAR_STD).view(3, 1, 1)
    with torch.inference_mode():
        probs = resnet(x[None]).softmax(dim=1)[0]
    assert CIFAR10_CLASSES[int(probs.argmax())] == "cat"
    assert probs[3].item() > 0.9


@pytest.mark.skipif(
    not ASTRONAUT.is_file(), reason=f"{ASTRONAUT} is absent (../shared not present)"
)
def test_ultraface_finds_the_astronauts_face(ultraface: UltraFaceSlim) -> None:
    rgb = torch.from_numpy(_read_rgb(ASTRONAUT, 320, 240)).permute(2, 0, 1).float()
    with torch.inference_mode():
        scores, boxes = ultraface(((rgb - IMAGE_MEAN) / IMAGE_STD)[None])
    best = int(scores[0, :, 1].argmax())
    assert scores[0, best, 1].item() > 0.9
    x1, y1, x2, y2 = boxes[0, best].tolist()
    # The face spans about x 0.35..0.53, y 0.12..0.34 of the 512x512 photo (checked by eye).
    assert 0.30 < x1 < 0.40 and 0.48 < x2 < 0.58
    assert 0.07 < y1 < 0.17 and 0.29 < y2 < 0.39


@pytest.mark.skipif(not ULTRAFACE_ONNX.is_file(), reason=f"{ULTRAFACE_ONNX} is absent")
def test_ultraface_matches_the_onnx_export(ultraface: UltraFaceSlim) -> None:
    ort = pytest.importorskip("onnxruntime")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(ULTRAFACE_ONNX), options, providers=["CPUExecutionProvider"])
    x = torch.randn(1, 3, 240, 320, generator=torch.Generator().manual_seed(0))
    onnx_scores, onnx_boxes = session.run(["scores", "boxes"], {"input": x.numpy()})
    with torch.inference_mode():
        scores, boxes = ultraface(x)
    np.testing.assert_allclose(scores.numpy(), onnx_scores, atol=1e-4, rtol=0)
    np.testing.assert_allclose(boxes.numpy(), onnx_boxes, atol=1e-4, rtol=0)


def test_fx_traces_give_the_eager_outputs(resnet: ResNet, ultraface: UltraFaceSlim) -> None:
    x = _synthetic(3, 32, 32)
    traced = torch.fx.symbolic_trace(resnet)
    with torch.inference_mode():
        torch.testing.assert_close(traced(x), resnet(x), atol=0, rtol=0)
    x = _synthetic(2, 240, 320)
    traced = torch.fx.symbolic_trace(ultraface)
    with torch.inference_mode():
        for got, want in zip(traced(x), ultraface(x), strict=True):
            torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.mark.parametrize(
    ("load", "shipped", "name"),
    [
        (load_resnet20, RESNET20_WEIGHTS, "ResNet-20"),
        (load_ultraface, ULTRAFACE_WEIGHTS, "UltraFace"),
    ],
)
@pytest.mark.parametrize("damage", ["truncated", "random", "empty", "other_model"])
def test_corrupt_weights_file_names_the_file(
    tmp_path: Path, load: Callable[[Path], nn.Module], shipped: Path, name: str, damage: str
) -> None:
    data = shipped.read_bytes()
    if damage == "truncated":
        content = data[: len(data) // 2]
    elif damage == "random":
        content = np.random.default_rng(3).bytes(4096)
    elif damage == "empty":
        content = b""
    else:
        content = (
            ULTRAFACE_WEIGHTS if shipped == RESNET20_WEIGHTS else RESNET20_WEIGHTS
        ).read_bytes()
    path = tmp_path / f"{damage}.pth"
    path.write_bytes(content)
    with pytest.raises(ValueError) as info:
        load(path)
    message = str(info.value)
    assert message.startswith(f"{path}: expected an") and name in message
    assert "could not load" in message and "\n" not in message


def test_missing_weights_file_names_the_file(tmp_path: Path) -> None:
    for load in (load_resnet20, load_ultraface):
        with pytest.raises(FileNotFoundError, match=r"nope\.pth"):
            load(tmp_path / "nope.pth")
