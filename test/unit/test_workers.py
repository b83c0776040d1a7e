"""meshrt.tools.workers: jobs in this process, in spawned processes, or on Ray."""

from __future__ import annotations

import argparse
import sys

import pytest

from meshrt.tools.bench import micro_batch_list
from meshrt.tools.workers import WorkerError, parse_ray_address, run_jobs

# a job: a module-level Python function (Ray takes no builtins) and a picklable argument
JOBS = ["4,2,1", "8", "16,1", "3,3", "2", "64,32"]


@pytest.mark.parametrize("workers", [1, 2])
def test_every_job_once_with_its_index(workers):
    got = dict(run_jobs(micro_batch_list, JOBS, workers))
    assert got == {i: micro_batch_list(n) for i, n in enumerate(JOBS)}


def test_a_job_error_reaches_the_caller():
    with pytest.raises(argparse.ArgumentTypeError, match="got '0'"):
        dict(run_jobs(micro_batch_list, ["1", "0", "2"], 2))


def test_ray_missing_is_a_one_line_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(WorkerError, match=r"--ray needs the ray package"):
        dict(run_jobs(micro_batch_list, JOBS, 1, ray_address="local"))


def test_a_local_ray_instance_runs_the_jobs():
    """The test extra installs ray: a local instance, started and stopped here."""
    import ray

    try:
        got = dict(run_jobs(micro_batch_list, JOBS, ray_address="local"))
    finally:
        ray.shutdown()
    assert got == {i: micro_batch_list(n) for i, n in enumerate(JOBS)}


@pytest.mark.parametrize("text, ok", [("local", True), ("auto", True), ("10.0.0.2:6379", True),
                                      ("ray://head:10001", True), ("nowhere", False),
                                      ("host:", False), (":6379", False), ("ray://h:p", False)])
def test_ray_addresses(text, ok):
    if ok:
        assert parse_ray_address(text) == text
    else:
        with pytest.raises(argparse.ArgumentTypeError, match="expected 'local', 'auto'"):
            parse_ray_address(text)


def test_an_unreachable_cluster_is_an_error_within_seconds():
    """Ray retries an address nothing listens on for minutes; the TCP check says so first."""
    with pytest.raises(WorkerError, match=r"--ray 127.0.0.1:1: cannot connect"):
        dict(run_jobs(micro_batch_list, JOBS, ray_address="127.0.0.1:1"))
