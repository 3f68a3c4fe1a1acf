#!/usr/bin/env bash
# Make .resume/results.tar.gz from a device call's returned results.tar.gz, so that the next
# call (tools/h200-run.sh, on a fresh machine) goes on where that run stopped.
#   usage: bash tools/resume-pack.sh RETURNED_RESULTS_TAR_GZ [PATH...]
# PATHs (relative to the repository root, e.g. results/survey/strict/tasks/90.json) are left
# out of the archive, so that the jobs making them run again. So are an audit's `not checked`
# records (kind check_refused): a check refused for the scratch disk free on that machine says
# nothing of the candidate, and the next machine may have the disk.
# The returned archive leaves out the KernelBench checkout (results/kernelbench/checkout): it is
# made again here from the carried .kb/KernelBench.git at the pinned commit, its files' times
# set to the pin record's, so that Snakemake sees the checkout it made. Run from the repository
# root, with the project installed (kbfuse's own pin_kernelbench makes the checkout).
set -euo pipefail
returned=$(realpath "${1:?usage: bash tools/resume-pack.sh RETURNED_RESULTS_TAR_GZ [PATH...]}")
shift
[ -d .kb/KernelBench.git ] || { echo "no .kb/KernelBench.git: run tools/device-carry.sh" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work" "$PWD/.resume/results.tar.gz.tmp"' EXIT
tar xzf "$returned" -C "$work"
for path in "$@"; do
  [ -e "$work/$path" ] || { echo "$returned has no $path" >&2; exit 1; }
  rm -r "${work:?}/$path" && echo "left out: $path"
done
python3 - "$work" <<'EOF'
import json, sys
from pathlib import Path

work = Path(sys.argv[1])
for verdict in sorted(work.glob("results/audit/*/verdicts/*/*.json")):
    if json.loads(verdict.read_text()).get("kind") == "check_refused":
        verdict.unlink()
        print(f"left out (refused on that machine, checked again): {verdict.relative_to(work)}")
EOF
record="$work/results/kernelbench/checkout.json"
[ -f "$record" ] || { echo "$returned has no results/kernelbench/checkout.json" >&2; exit 1; }
python3 - "$PWD/.kb/KernelBench.git" "$record" "$work" <<'EOF'
import json, sys
from pathlib import Path
from kbfuse.tasks.kernelbench import pin_kernelbench

url, record, work = sys.argv[1], json.loads(Path(sys.argv[2]).read_text()), Path(sys.argv[3])
pin_kernelbench(  # its own record goes beside the archive's contents, deleted with them
    url=url, commit=record["commit"], level=record["level"],
    tasks=[int(t) for t in record["tasks"]],
    checkout=work / "results/kernelbench/checkout", pin_json=work / "pin-again.json",
)
EOF
find "$work/results/kernelbench/checkout" -exec touch -h -r "$record" {} +
mkdir -p .resume
rm "$work/pin-again.json"
(cd "$work" && tar czf "$OLDPWD/.resume/results.tar.gz.tmp" results .snakemake)
mv .resume/results.tar.gz.tmp .resume/results.tar.gz
echo "wrote .resume/results.tar.gz ($(du -h .resume/results.tar.gz | cut -f1))"
