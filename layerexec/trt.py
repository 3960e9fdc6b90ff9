"""Optional TensorRT backend for the client's local layers (paper 003 section 5.2).

Used only when `tensorrt` imports and a CUDA GPU is present (`available()` says why not
otherwise). `TensorRTStages` compiles stages [k0, k1) of a model for one batch size: the stages
are exported to ONNX, parsed and built into an engine (fp32, or fp16 when asked), and called like
the stages they replace, on CUDA tensors.
"""

from __future__ import annotations

import io
from typing import Any

import torch
from torch import nn

from layerexec.zoo import StagedModel


def available() -> tuple[bool, str]:
    """(whether TensorRT can be used here, and if not, why)."""
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return False, "the tensorrt package is not installed (pip install '.[jetson]')"
    if not torch.cuda.is_available():
        return False, "TensorRT needs a CUDA GPU and none is present"
    return True, ""


class TensorRTStages:
    """Stages [k0, k1) of `model` as one TensorRT engine for batches of exactly `batch`."""

    def __init__(
        self, model: StagedModel, k0: int, k1: int, batch: int, fp16: bool = False
    ) -> None:
        ok, why = available()
        if not ok:
            raise RuntimeError(why)
        import tensorrt as trt

        self.batch = batch
        part = nn.Sequential(*model.stages[k0:k1]).eval().cuda()
        shape = (batch, *model.in_shapes[k0])
        example = torch.zeros(shape, device="cuda")
        with torch.inference_mode():
            out = part(example)
        if not isinstance(out, torch.Tensor):
            raise ValueError(f"stages [{k0}, {k1}) of {model.name} do not end in a tensor")
        self.out_shape = tuple(out.shape)
        onnx = io.BytesIO()
        target: Any = onnx  # export accepts a file-like object, though typed for paths
        torch.onnx.export(
            part, (example,), target, input_names=["x"], output_names=["y"], dynamo=False
        )
        logger = trt.Logger(trt.Logger.WARNING)
        builder = trt.Builder(logger)
        network = builder.create_network(0)
        parser = trt.OnnxParser(network, logger)
        if not parser.parse(onnx.getvalue()):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise RuntimeError(
                f"TensorRT could not parse stages [{k0}, {k1}) of {model.name}: {errors}"
            )
        config = builder.create_builder_config()
        if fp16:
            config.set_flag(trt.BuilderFlag.FP16)
        plan = builder.build_serialized_network(network, config)
        if plan is None:
            raise RuntimeError(f"TensorRT could not build stages [{k0}, {k1}) of {model.name}")
        self._engine: Any = trt.Runtime(logger).deserialize_cuda_engine(plan)
        self._context: Any = self._engine.create_execution_context()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape[:1]) != (self.batch,):
            raise ValueError(f"this engine runs batches of {self.batch}, got {x.shape[0]}")
        x = x.contiguous().cuda()
        y = torch.empty(self.out_shape, device="cuda", dtype=torch.float32)
        self._context.set_tensor_address("x", x.data_ptr())
        self._context.set_tensor_address("y", y.data_ptr())
        stream = torch.cuda.current_stream()
        if not self._context.execute_async_v3(stream.cuda_stream):
            raise RuntimeError("TensorRT execution failed")
        stream.synchronize()
        return y
