"""`bench/peers.py --profile`: layerbatch's server sampled by py-spy under load, and where its
time goes by category and thread."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.peers_arrivals import poisson_arrivals_s
from bench.peers_knobs import tuning_records
from bench.peers_load import Load, summarize
from bench.peers_servers import Running
from bench.peers_settings import Settings, layerbatch_grid

ROOT = Path(__file__).resolve().parent.parent
# where a sampled stack's time goes: the first category (in this order) whose pattern is in
# the stack; patterns are substrings of py-spy's "function (file:line)" frames
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("decode (imdecode, resize, normalise)", ("imdecode", "image_tensor", "rgb_tensor", "_decode")),
    ("forward (torch modules)", ("torch/nn/modules", "torch/fx", "_call_impl", "GraphModule")),
    (
        "copies (gather/scatter, stack, layout)",
        ("stack", "_gather", "scatter", "contiguous", "cat ("),
    ),
    ("planning (scheduler)", ("scheduler/",)),
    ("results (softmax, top-5, describe)", ("results.py", "describe")),
    ("HTTP + msgpack (aiohttp, wire)", ("aiohttp", "msgpack", "wire.py", "web_protocol")),
    ("event loop (asyncio)", ("asyncio/", "base_events", "selectors")),
    (
        "thread hand-offs (futures, queues, locks)",
        ("concurrent/futures", "threading.py", "queue.py"),
    ),
)


def find_py_spy(python: Path) -> Path:
    """py-spy beside `python` (the peers' venv installs it there) or else on PATH; SystemExit
    saying where to get it when neither has one."""
    beside = python.parent / "py-spy"
    if beside.is_file():
        return beside
    found = shutil.which("py-spy")
    if found:
        return Path(found)
    raise SystemExit(
        f"--profile: py-spy is neither beside {python} nor on PATH; run bench/peers.py with "
        ".venv-peers/bin/python (make .venv-peers/.installed installs py-spy there)"
    )


def categorize(stack: str) -> str:
    """The category of the innermost frame of `stack` (frames joined by ";") that has one."""
    for frame in reversed(stack.split(";")):
        for name, pats in CATEGORIES:
            if any(p in frame for p in pats):
                return name
    return "other"


def profile_breakdown(raw_lines: Sequence[str], top: int = 25) -> dict[str, Any]:
    """py-spy raw (collapsed) stacks, `thread (tid);frame;...;frame count` per line, as: samples
    per thread, per category (see CATEGORIES) per thread, and the top self-time frames."""
    threads: dict[str, int] = {}
    cats: dict[str, dict[str, int]] = {}
    leaves: dict[str, int] = {}
    total = 0
    for ln in raw_lines:
        ln = ln.strip()
        if not ln or " " not in ln:
            continue
        stack, _, count_s = ln.rpartition(" ")
        try:
            count = int(count_s)
        except ValueError:
            continue
        frames = stack.split(";")
        thread = frames[0] if frames[0].startswith(("thread", "process")) else "?"
        if thread.startswith("process") and len(frames) > 1 and frames[1].startswith("thread"):
            thread = frames[1]
        total += count
        threads[thread] = threads.get(thread, 0) + count
        c = cats.setdefault(thread, {})
        cat = categorize(stack)
        c[cat] = c.get(cat, 0) + count
        leaves[frames[-1]] = leaves.get(frames[-1], 0) + count
    return {
        "samples": total,
        "threads": dict(sorted(threads.items(), key=lambda kv: -kv[1])),
        "categories": {
            t: dict(sorted(v.items(), key=lambda kv: -kv[1]))
            for t, v in sorted(cats.items(), key=lambda kv: -threads[kv[0]])
        },
        "top_self": dict(sorted(leaves.items(), key=lambda kv: -kv[1])[:top]),
    }


async def profile_layerbatch(
    st: Settings, frames: list[bytes], model: str, rate: float, seconds: float, deadline: float
) -> dict[str, Any]:
    """layerbatch serving Poisson load at `rate` while py-spy samples its process (100 Hz,
    every thread, on-CPU stacks only; a second pass with idle stacks shows where threads wait)."""
    spy = find_py_spy(Path(sys.executable))
    out: dict[str, Any] = {"model": model, "rate_rps": rate, "deadline_ms": deadline}
    run = Running("layerbatch", model, layerbatch_grid(st)[-1], deadline, st.logdir, st.policy)
    load = Load(run, frames, deadline)
    try:
        await load.ready()
        for mode, extra in (("cpu", []), ("idle", ["--idle"])):
            raw = st.logdir / f"profile-layerbatch-{model}-{mode}.txt"
            cmd = [str(spy), "record", "-p", str(run.proc.pid), "-d", f"{seconds:g}", "-r", "100"]
            cmd += ["--threads", "--nonblocking", "-f", "raw", "-o", str(raw), *extra]
            spy_proc = await asyncio.create_subprocess_exec(
                *cmd, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
            )
            arr = poisson_arrivals_s(rate, seconds, np.random.default_rng([st.seed, 99]))
            samples = await load.run_arrivals(arr, deadline / 1000.0)
            _, err = await spy_proc.communicate()
            if spy_proc.returncode != 0:
                raise RuntimeError(f"py-spy failed: {err.decode()[-500:]}")
            out[mode] = {
                "load": summarize(samples, deadline, seconds),
                **profile_breakdown(raw.read_text().splitlines()),
                "raw": str(raw.relative_to(ROOT)),
            }
            await load.quiesce()
        import aiohttp

        async with aiohttp.ClientSession() as s, s.get(f"{run.url}/metrics") as r:
            out["metrics"] = [
                ln
                for ln in (await r.text()).splitlines()
                if ln.startswith(
                    ("layerbatch_plan", "layerbatch_step", "layerbatch_batch", "layerbatch_busy")
                )
                and not ln.startswith("#")
            ][:80]
        async with aiohttp.ClientSession() as s, s.get(f"{run.url}/v1/status") as r:
            out["status"] = await r.json()
    finally:
        await load.close()
        run.stop()
    return out


def profile_main(st: Settings, frames: list[bytes]) -> None:
    model, deadline = st.models[0], st.deadlines[0]
    rate = st.profile_rate
    if rate is None:
        found = [
            r["capacity_rps"]
            for _, r in tuning_records(st.out, model)
            if (r["server"], r["deadline_ms"]) == ("layerbatch", deadline)
        ]
        if not found:
            raise SystemExit("--profile: give --profile-rate (no layerbatch capacity on record)")
        rate = float(found[0])
    doc = asyncio.run(profile_layerbatch(st, frames, model, rate, st.profile_s, deadline))
    path = st.out.with_name("peers-profile.json")
    path.write_text(json.dumps(doc, indent=1, default=str))
    for mode in ("cpu", "idle"):
        d = doc[mode]
        print(f"[{mode}] {d['samples']} samples; load {d['load']}")
        for t, cats in d["categories"].items():
            n = d["threads"][t]
            print(f"  {t}: {n} samples")
            for c, k in cats.items():
                print(f"    {100.0 * k / n:5.1f}%  {c}")
        print("  top self frames:")
        for f, k in list(d["top_self"].items())[:15]:
            print(f"    {100.0 * k / max(d['samples'], 1):5.1f}%  {f}")
    print(f"wrote {path}")
