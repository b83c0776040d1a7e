"""Independent jobs in parallel: spawned worker processes, or a Ray cluster.

`meshrt bench` builds its configurations and `bench/bench_interpreter.py
--sweep` runs its seeds through `run_jobs`: in this process (one worker),
in a pool of spawned processes (each a fresh interpreter: nothing inherited
from the caller), or, given `--ray ADDRESS`, as Ray tasks on the cluster at
ADDRESS ("local" starts one on this machine). Ray is an optional extra
(`pip install -e ".[ray]"`); every node needs meshrt installed. A job is a
module-level function and a picklable argument; results come back as jobs
finish, so a caller reports progress and can stop early.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import TypeVar

__all__ = ["WorkerError", "check_cluster", "default_workers", "parse_ray_address", "run_jobs"]

J = TypeVar("J")
R = TypeVar("R")


class WorkerError(Exception):
    """A worker back end that cannot start (Ray missing or unreachable): one line."""


def default_workers() -> int:
    """One worker per CPU, at most 4 (each may hold a compiled model in memory)."""
    return max(1, min(4, os.cpu_count() or 1))


def run_jobs(fn: Callable[[J], R], jobs: Sequence[J], workers: int = 1,
             ray_address: str | None = None) -> Iterator[tuple[int, R]]:
    """(index in `jobs`, fn(job)) of every job, in the order they finish. A job's own
    exception propagates; a generator closed early cancels the jobs not started."""
    if ray_address:
        yield from _ray_jobs(fn, jobs, ray_address)
        return
    if workers <= 1 or len(jobs) <= 1:
        for i, job in enumerate(jobs):
            yield i, fn(job)
        return
    pool = ProcessPoolExecutor(max_workers=min(workers, len(jobs)),
                               mp_context=multiprocessing.get_context("spawn"))
    try:
        futures = {pool.submit(fn, job): i for i, job in enumerate(jobs)}
        for f in as_completed(futures):
            yield futures[f], f.result()
    finally:  # also on an interrupt or an early close: drop what has not started
        pool.shutdown(wait=False, cancel_futures=True)


CONNECT_TIMEOUT_S = 10.0


def parse_ray_address(text: str) -> str:
    """`--ray ADDRESS`: 'local', 'auto' (the cluster this machine belongs to), HOST:PORT or
    ray://HOST:PORT; an argparse error otherwise."""
    import argparse

    if text in ("local", "auto"):
        return text
    host, sep, port = text.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(
            f"expected 'local', 'auto', HOST:PORT or ray://HOST:PORT, got '{text}'")
    return text


def check_cluster(address: str) -> None:
    """WorkerError unless a HOST:PORT (or ray://HOST:PORT) address takes a TCP connection
    within CONNECT_TIMEOUT_S (Ray itself retries an unreachable address for minutes);
    'local' and 'auto' pass."""
    import socket

    if address in ("local", "auto"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise WorkerError(f"--ray {address}: cannot connect: {e.strerror or e}") from None


def _ray_jobs(fn, jobs, address: str):
    try:
        import ray
    except ImportError:
        raise WorkerError("--ray needs the ray package: pip install -e \".[ray]\"") from None
    check_cluster(address)
    try:
        if not ray.is_initialized():
            ray.init(address=None if address == "local" else address, log_to_driver=False,
                     include_dashboard=False)
    except Exception as e:  # Ray's own connection errors vary by version
        raise WorkerError(f"--ray {address}: cannot connect: {str(e).splitlines()[0]}") from None
    task = ray.remote(fn)
    index = {task.remote(job): i for i, job in enumerate(jobs)}
    pending = list(index)
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            yield index[done[0]], ray.get(done[0])
    finally:
        for ref in pending:
            ray.cancel(ref)
