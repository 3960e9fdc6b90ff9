"""Discrete-event simulator: the same scheduler, profiled execution, metrics, capacity search."""
