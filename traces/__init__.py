"""Arrival processes, network traces and the data the project bundles (`traces/data/`)."""

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
