"""Entry point of the child processes: `python -m kbfuse.candidates.child ROLE REQUEST.json`.

Roles: `reference` (kbfuse.candidates.reference), `candidate` (kbfuse.candidates.runner),
`witness` (kbfuse.candidates.witness). The reference and the candidate run in the request's
`numerics` mode (kbfuse.survey.settings.NUMERICS) where it names one. Each reads its request,
writes its JSON and tensor files under the request's `out` folder and exits 0; an exception
is written to `out/error.json` (type, first line) before the exit status 1, so the parent can
name the stage that failed. What the roles share is in kbfuse.candidates.childio.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

from kbfuse.candidates.childio import error_record, write_json


def main(argv: list[str]) -> int:
    role, request_path = argv
    request = json.loads(Path(request_path).read_text())
    out = Path(request["out"])
    out.mkdir(parents=True, exist_ok=True)
    if role == "reference":
        from kbfuse.candidates.reference import run_reference as run
    elif role == "candidate":
        from kbfuse.candidates.runner import run_candidate as run
    elif role == "witness":
        from kbfuse.candidates.witness import run_witness as run
    else:
        raise SystemExit(f"unknown role {role!r}")
    try:
        if request.get("numerics") is not None and role != "witness":
            from kbfuse.survey.settings import set_numerics

            set_numerics(request["numerics"])  # before the task, the candidate, any compile
        run(request, out)
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a record
        write_json(out / "error.json", error_record(exc, role))
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
