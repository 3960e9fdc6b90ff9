"""What the CLI tests share: a shipped profile and a model to name, a client run that ends at
once, and `refused`, the one line a refused command prints (`layerbatch.main` in process)."""

from __future__ import annotations

import pytest

import layerbatch

GOOGLENET = "googlenet-v3-pytorch-V100"  # a shipped profile, by name
CIFAR = "resnet20_cifar10"
FAST_CLIENT = ["--app", CIFAR, "--source", "synthetic", "--frames", "2", "--duration", "1"]


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The one line on stderr of a command that must exit 2 having printed nothing else."""
    code = layerbatch.main(list(argv))
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert out == "" and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()
