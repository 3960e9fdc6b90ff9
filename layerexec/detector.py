"""SSDLite (torchvision `ssdlite320_mobilenet_v3_large`) as stages for layer-wise batching.

The front (input normalisation and the MobileNetV3 trunk up to the first feature map the heads
read) is split layer by layer; every later part keeps two or more feature maps alive at once, so
it is the last stage: the rest of the backbone, the extra layers, the heads, the anchors and the
post-processing (score threshold, top-k, NMS). Inputs are 3 x 320 x 320 images in [0, 1]: the
model's own resize to 320 x 320 is then the identity and is skipped; outputs are per image
`{"boxes", "scores", "labels"}` in input pixels, as `model([image])` returns them.
"""

from __future__ import annotations

import torch
from torch import nn
from torchvision.models.detection.image_list import ImageList
from torchvision.models.detection.ssd import SSD

INPUT_SIZE = 320


class SSDFront(nn.Module):
    """Normalisation and the first feature block of the backbone (fx-traceable)."""

    def __init__(self, model: SSD) -> None:
        super().__init__()
        mean = torch.tensor(model.transform.image_mean).view(1, 3, 1, 1)
        std = torch.tensor(model.transform.image_std).view(1, 3, 1, 1)
        self.mean: torch.Tensor
        self.std: torch.Tensor
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)
        self.features0 = model.backbone.features[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.features0((x - self.mean) / self.std)
        return y


class SSDTail(nn.Module):
    """From the first feature map to detections: one stage (it holds several feature maps)."""

    def __init__(self, model: SSD) -> None:
        super().__init__()
        self.model = model

    def forward(self, c4: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        m = self.model
        x = m.backbone.features[1](c4)
        features = [c4, x]
        for block in m.backbone.extra:
            x = block(x)
            features.append(x)
        head = m.head(features)
        n = c4.shape[0]
        sizes = [(INPUT_SIZE, INPUT_SIZE)] * n
        images = ImageList(c4.new_empty((n, 3, INPUT_SIZE, INPUT_SIZE)), sizes)
        anchors = m.anchor_generator(images, features)
        detections = m.postprocess_detections(head, anchors, sizes)
        return list(m.transform.postprocess(detections, sizes, sizes))
