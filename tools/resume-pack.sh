#!/usr/bin/env bash
# Make resume/results.tar.gz from a device call's returned results.tar.gz, so that the next
# call (tools/h200-run.sh, on a fresh machine, in this session or a later one) goes on where
# that run stopped. The pack is tracked in git: a development machine's untracked files do not
# outlive its session (session 24 lost two packs so), the repository does.
#   usage: bash tools/resume-pack.sh RETURNED_RESULTS_TAR_GZ [PATH...]
# PATHs (relative to the repository root, e.g. results/survey/strict/tasks/90.json) are left
# out of the pack, so that the jobs making them run again. So are an audit's `not checked`
# records (kind check_refused): a check refused for the scratch disk free on that machine says
# nothing of the candidate, and the next machine may have the disk.
# The pack holds no file of KernelBench's (the returned archive has no checkout; the pin record
# results/kernelbench/checkout.json stays, and tools/resume-unpack.sh makes the checkout again
# from the carried .kb/KernelBench.git), nor the repository's own tracked results/reference,
# nor the witness cache (results/check/witness-cache: built extensions, made again on demand).
set -euo pipefail
returned=$(realpath "${1:?usage: bash tools/resume-pack.sh RETURNED_RESULTS_TAR_GZ [PATH...]}")
shift
work=$(mktemp -d)
trap 'rm -rf "$work" "$PWD/resume/results.tar.gz.tmp"' EXIT
tar xzf "$returned" -C "$work"
[ -f "$work/results/kernelbench/checkout.json" ] \
  || { echo "$returned has no results/kernelbench/checkout.json" >&2; exit 1; }
for path in "$@"; do
  [ -e "$work/$path" ] || { echo "$returned has no $path" >&2; exit 1; }
done
for path in "$@"; do
  rm -r "${work:?}/$path" && echo "left out: $path"
done
rm -rf "$work/results/kernelbench/checkout" "$work/results/reference" \
  "$work/results/check/witness-cache"
python3 - "$work" <<'PY'
import json, sys
from pathlib import Path

work = Path(sys.argv[1])
for verdict in sorted(work.glob("results/audit/*/verdicts/*/*.json")):
    if json.loads(verdict.read_text()).get("kind") == "check_refused":
        verdict.unlink()
        print(f"left out (refused on that machine, checked again): {verdict.relative_to(work)}")
PY
mkdir -p resume
(cd "$work" && tar czf "$OLDPWD/resume/results.tar.gz.tmp" results .snakemake)
mv resume/results.tar.gz.tmp resume/results.tar.gz
echo "wrote resume/results.tar.gz ($(du -h resume/results.tar.gz | cut -f1)): commit it"
