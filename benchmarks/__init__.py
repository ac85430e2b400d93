"""Benchmarks, run as python -m benchmarks.NAME.

A regular package: a "benchmarks" package in site-packages would shadow a namespace package.
"""


def prepare_process(threads: int | None, device_name: str):
    """The process set-up every benchmark shares: the CLI's allocator setting (applied to every side measured),
    torch's CPU threads (None or 0: torch's choice) and the device. Returns (allocator note, device)."""
    import torch

    from transdenoiser.runtime import keep_freed_memory, resolve_device

    allocator = "glibc heap kept (runtime.keep_freed_memory), both sides" if keep_freed_memory() else "system default"
    if threads:
        torch.set_num_threads(threads)
    return allocator, resolve_device(device_name)


def stamped(record: dict) -> dict:
    """``record`` with the commit it ran at and whether the checkout's tracked files differed from it
    (:func:`checkout_commit`, :func:`tracked_changes`), where it does not say itself (the serving benchmarks say
    ``uncommitted_serving_changes``)."""
    record = dict(record)
    if "commit" not in record:
        record["commit"] = checkout_commit()
    if "uncommitted_changes" not in record and "uncommitted_serving_changes" not in record:
        record["uncommitted_changes"] = tracked_changes()
    return record


def write_result(out, record: dict):
    """Write a benchmark's JSON record to ``out`` (parents created), :func:`stamped`; return the path."""
    import json
    from pathlib import Path

    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(stamped(record), indent=2))
    return path


COMMIT_ENV = "TRANSDENOISER_COMMIT"  # the commit of a tree that travelled without its .git (the GPU check's machine)


def print_result(out, record: dict) -> dict:
    """``record``, :func:`stamped`, written to ``out`` where one is given (:func:`write_result`) and printed as JSON
    on stdout; returns the stamped record."""
    import json

    record = stamped(record)
    if out:
        write_result(out, record)
    print(json.dumps(record, indent=2))
    return record


def checkout_commit() -> str | None:
    """The commit of the checkout the benchmarks run from: ``TRANSDENOISER_COMMIT`` where it is set, else git's short
    HEAD (None without git)."""
    import os
    import subprocess
    from pathlib import Path

    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    try:
        return subprocess.run(["git", "-C", str(Path(__file__).resolve().parent.parent), "rev-parse", "--short",
                               "HEAD"], capture_output=True, text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def tracked_changes(*paths: str) -> bool | None:
    """Whether the checkout's tracked files (those under ``paths``, folders of the checkout; all by default) differ
    from its commit (``git status``; untracked files aside), or None where that is not known: no git, or a tree that
    travelled without its .git (``TRANSDENOISER_COMMIT`` set)."""
    import os
    import subprocess
    from pathlib import Path

    if os.environ.get(COMMIT_ENV):
        return None
    try:
        result = subprocess.run(["git", "-C", str(Path(__file__).resolve().parent.parent), "status", "--porcelain",
                                 "--untracked-files=no", "--", *paths], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return bool(result.stdout.strip()) if result.returncode == 0 else None
