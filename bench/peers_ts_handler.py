"""TorchServe's handler for bench/peers.py: a batch of JPEG request bodies -> top-5 per request.

Archived into the model's .mar by bench/peers_torchserve.py; the model it serves is the registered
model's name (`context.model_name`); `peers_model` comes from BENCH_DIR (set by the launcher).
"""

from __future__ import annotations

import os
import sys
from typing import Any


class Handler:
    def __init__(self) -> None:
        self.model: Any = None

    def initialize(self, context: Any) -> None:
        sys.path.insert(0, os.environ["BENCH_DIR"])
        from peers_model import Model

        batch = int(context.system_properties.get("batch_size") or 1)
        self.model = Model(context.model_name, warm_batches=(1, batch))

    def handle(self, data: list[dict[str, Any]], context: Any) -> list[dict[str, Any]]:
        bodies = [bytes(row.get("body") or row.get("data") or b"") for row in data]
        out: list[dict[str, Any]] = self.model.infer(bodies)
        return out
