"""Envoy configurations read away from the event loop (the watcher's and the admin reload's):
the generic machinery of :mod:`control_plane.rules.offload` (a child process bounded in CPU
and memory for files over ``SMALL_BYTES``, frames, slices of work on the loop) with the
Envoy configuration's own reading (:func:`serve_in_child`, run in the child) and building."""

from __future__ import annotations

import asyncio
import pickle
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..rules.offload import (
    FRAME_RECORDS,
    SMALL_BYTES,
    breathe,
    in_child,
    keep_out_of_collections,
    pickled,
    release_steps,
    run_steps,
)
from ..rules.yaml_source import gc_paused
from .config import EnvoyConfig, EnvoyPlan, build_steps, files_digest, plan_envoy_files

if TYPE_CHECKING:
    from ..settings import Settings

__all__ = ["parse_envoy_offloaded", "serve_in_child"]


async def parse_envoy_offloaded(
    files: Sequence[tuple[str, bytes]], settings: Settings, *, digest: str, clock: Callable[[], float] = time.time
) -> EnvoyConfig:
    """:func:`~control_plane.envoy.config.parse_envoy_files`, without holding the loop."""
    if sum(len(data) for _, data in files) <= SMALL_BYTES:
        plan = await asyncio.to_thread(plan_envoy_files, files, digest=digest)
        return await run_steps(build_steps(plan, settings, clock=clock))
    sources = [source for source, _ in files]
    frames = await in_child({"serve": serve_in_child, "sources": sources, "digest": digest})
    with gc_paused():
        plan = EnvoyPlan([(source, domain, []) for source, domain in frames[0]], digest)
        for index, chunk in frames[1:]:
            plan.files[index][2].extend(pickle.loads(chunk))
            await breathe()
        config = await run_steps(build_steps(plan, settings, clock=clock))
        keep_out_of_collections()
        for _, _, records in plan.files:  # freed a step at a time too
            await run_steps(release_steps(records))
    return config


def serve_in_child(files: list[tuple[str, bytes]], request: dict[str, Any], send: Callable[[str, Any], None]) -> None:
    """In the child: the files planned (as :func:`~control_plane.envoy.config.plan_envoy_files`)
    and sent back as frames of descriptor records."""
    digest = request["digest"]
    if files_digest(files) != digest:
        return send("changed", "the files changed since the parent read them")
    plan: EnvoyPlan = plan_envoy_files(files, digest=digest, on_file=lambda source: send("file", source))
    send("frame", [(source, domain) for source, domain, _ in plan.files])
    for index, (_, _, records) in enumerate(plan.files):
        for i in range(0, len(records), FRAME_RECORDS):
            send("frame", (index, pickled(records[i : i + FRAME_RECORDS])))
    return None
