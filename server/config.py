"""The server's settings and the keys under which the app holds them and its runtime."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from server.replicas import Replicas
from server.runtime import Runtime

Served = Runtime | Replicas  # what the app serves: one runtime, or several (`server.replicas`)


@dataclass(frozen=True)
class ServerConfig:
    """`admin_token`: required by PUT /v1/policy when set; `default_deadline_ms`: for requests
    that give none; `max_body_bytes`: larger bodies get 413; `body_timeout_s`: a body not all
    arrived by then gets 408 (`server.body`)."""

    admin_token: str | None = None
    default_deadline_ms: float = 1000.0
    max_body_bytes: int = 16 * 2**20
    body_timeout_s: float = 60.0


RUNTIME: web.AppKey[Served] = web.AppKey("runtime")
CONFIG = web.AppKey("config", ServerConfig)
