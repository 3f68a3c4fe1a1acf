"""Run `kbfuse check` in a process of its own and report how it went, for the tests of hostile
candidates (tests/test_check_hostile.py, tests/test_check_escapes.py):

    python tests/checker.py REPORT.json [--lock-dir DIR] -- ARGUMENTS OF kbfuse check

REPORT.json gets {"rc": the exit status of `kbfuse check`, "max_rss_mb": the peak resident
memory of this process}: the checker's own (VmHWM: neither its children nor, as ru_maxrss
could, the process it was forked from). With
--lock-dir the check holds a GPU lock in that folder for its candidate, as `snakemake check`
does (kbfuse.workflow.gpulock).
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    split = argv.index("--")
    report, options, arguments = argv[0], argv[1:split], argv[split + 1 :]
    if options[:1] == ["--lock-dir"]:
        from kbfuse.candidates import check
        from kbfuse.workflow.gpulock import GpuLock

        original = check.check_candidate

        def with_lock(*args, **kwargs):
            return original(*args, lock=GpuLock("cpu-hostile", options[1]), **kwargs)

        check.check_candidate = with_lock
    from kbfuse.workflow.cli import main as kbfuse

    rc = kbfuse(arguments)
    with open("/proc/self/status") as status:
        peak = int(next(line for line in status if line.startswith("VmHWM")).split()[1]) / 1024
    with open(report, "w") as handle:
        json.dump({"rc": rc, "max_rss_mb": peak}, handle)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
