"""How limits reach the command: prlimit options, and the process cap where the worker's uid shares the count."""

from __future__ import annotations

from switchboard.sandbox.limits import CommandLimits


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
