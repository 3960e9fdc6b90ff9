"""The layer executor: models split into stages (torch.fx), a per-request activation store, and
an executor that runs exactly the actions the scheduler plans; profiling, memory bounds, stacking
and the optional TensorRT backend."""
