"""The cluster the pipeline planner (PPipe, paper 004, section 5.1 "Control plane") plans for.

A cluster is K GPU pools: N_k GPUs of type k, `per_server` of them behind one server NIC of
`nic_gbps` Gbit/s (full duplex, shared by the server's GPUs and by their MPS virtual GPUs, A.2).
Parsed from the issue-8 document `{"gpus": {"L4": {"count": 25, "per_server": 4}}, "nic_gbps": 10}`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from scheduler.errors import InputError
from scheduler.validate import is_number, known_keys


@dataclass(frozen=True)
class GpuPool:
    """`count` GPUs of one type, `per_server` of them behind one NIC."""

    count: int
    per_server: int


@dataclass(frozen=True)
class Cluster:
    """GPU pools by type and the NIC bit rate of every server, Gbit/s. `source` names the
    cluster in errors found later, when it is planned (its file, as a rule)."""

    gpus: Mapping[str, GpuPool]
    nic_gbps: float
    source: str = "cluster"

    @staticmethod
    def from_json(doc: object, source: str = "cluster") -> Cluster:
        """Parse `{"gpus": {"L4": {"count": 25, "per_server": 4}}, "nic_gbps": 10}`.

        Raises InputError naming the field for anything else, an unknown key included
        (`per_server` is 1 when missing: a misspelt one would otherwise be read as that).
        """
        if not isinstance(doc, dict):
            raise InputError(source, "", "a JSON object with gpus and nic_gbps", doc)
        known_keys(doc, ("gpus", "nic_gbps"), source, "")
        gpus_doc = doc.get("gpus")
        if not isinstance(gpus_doc, dict) or not gpus_doc:
            raise InputError(
                source, "gpus", "an object of GPU type -> {count, per_server}", gpus_doc
            )
        pools = {}
        for name, pool in sorted(gpus_doc.items()):
            if not isinstance(pool, dict):
                raise InputError(
                    source, f"gpus.{name}", "an object with count and per_server", pool
                )
            known_keys(pool, ("count", "per_server"), source, f"gpus.{name}")
            count, per_server = pool.get("count"), pool.get("per_server", 1)
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise InputError(source, f"gpus.{name}.count", "a non-negative integer", count)
            if not isinstance(per_server, int) or isinstance(per_server, bool) or per_server < 1:
                raise InputError(
                    source, f"gpus.{name}.per_server", "a positive integer", per_server
                )
            pools[str(name)] = GpuPool(count=count, per_server=per_server)
        nic = doc.get("nic_gbps")
        if not is_number(nic) or not (math.isfinite(nic) and nic > 0):
            raise InputError(source, "nic_gbps", "a positive number of Gbit/s", nic)
        return Cluster(gpus=pools, nic_gbps=float(nic), source=source)

    def types_in_use(self) -> list[str]:
        """GPU types with at least one GPU, sorted."""
        return [gpu for gpu in sorted(self.gpus) if self.gpus[gpu].count > 0]
