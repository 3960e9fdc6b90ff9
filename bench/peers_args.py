"""The command line every peer launcher of bench/peers.py shares: which model, which port, and the
knobs being tuned (bench/peers.py passes them)."""

from __future__ import annotations

import argparse


def launcher_parser() -> argparse.ArgumentParser:
    """--model, --port, --max-batch (8), --delay-ms (5), --workers (1: model workers, each
    with PEERS_TORCH_THREADS torch threads); a launcher adds its own flags."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--delay-ms", type=float, default=5.0)
    ap.add_argument("--workers", type=int, default=1)
    return ap
