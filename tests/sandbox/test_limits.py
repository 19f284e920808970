"""How limits reach the command: prlimit options, and the process cap where the worker's uid shares the count."""

from __future__ import annotations

import os
import threading

import pytest

from switchboard.sandbox.limits import CommandLimits, tasks_of_this_user


def test_prlimit_applies_every_limit_then_runs_the_command() -> None:
    argv = CommandLimits(cpu_s=7, memory_mb=100, processes=10, file_mb=2, open_files=50).prlimit_argv(
        "/usr/bin/prlimit", nproc=True
    )
    assert argv == [
        "/usr/bin/prlimit",
        f"--as={100 * 2**20}",
        "--cpu=7",
        f"--fsize={2 * 2**20}",
        "--nofile=50",
        "--core=0",
        "--nproc=10",
        "--",
    ]


def test_without_a_namespace_the_process_cap_counts_above_what_the_uid_runs() -> None:
    argv = CommandLimits(processes=10).prlimit_argv("prlimit", nproc=True, already=35)
    assert "--nproc=45" in argv


def test_a_pids_cgroup_replaces_the_process_rlimit() -> None:
    assert not any(a.startswith("--nproc") for a in CommandLimits().prlimit_argv("prlimit", nproc=False))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs a uid of its own: root only")
def test_the_tasks_of_this_user_are_its_processes_and_every_thread_of_theirs() -> None:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # a uid nobody else runs: the count is this process's alone
        try:
            os.close(read_fd)
            os.setgid(54_321)
            os.setuid(54_321)
            release = threading.Event()
            threads = [threading.Thread(target=release.wait) for _ in range(5)]
            for thread in threads:
                thread.start()
            os.write(write_fd, str(tasks_of_this_user()).encode())
            release.set()
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as result:
        counted = result.read()
    os.waitpid(pid, 0)
    assert counted == b"6"  # the process and its five threads


def test_the_workers_total_memory_bounds_how_many_commands_run_at_once() -> None:
    assert CommandLimits(memory_mb=1024, memory_total_mb=4096).slots(16) == 4
    assert CommandLimits(memory_mb=100, memory_total_mb=250).slots(16) == 2
    assert CommandLimits(memory_mb=64, memory_total_mb=4096).slots(16) == 16  # concurrency is the lower bound here
    assert CommandLimits(memory_mb=2048, memory_total_mb=1024).slots(16) == 1  # one command still runs
