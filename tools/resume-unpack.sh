#!/usr/bin/env bash
# Unpack a resume pack (tools/resume-pack.sh) into the working tree, once per machine, make the
# KernelBench checkout its pin record names again from the carried .kb/KernelBench.git, and
# give every file one time: now.
#   usage: bash tools/resume-unpack.sh ARCHIVE MARKER
# MARKER (a file outside the working tree) keeps the archive's checksum: a later call on the
# same warm machine unpacks nothing, so the archive never overwrites what a run still going in
# the background has written since.
# One time for all (to the nanosecond: the working tree may be copied within the same second),
# later than the working tree's copy: Snakemake reruns a job whose input file is newer than its
# output and differs from the recorded checksum, whatever --rerun-triggers
# says (snakemake/snakemake#2328). The working tree here is copied fresh at every call, so
# without this every source file a record depends on would be "newer", and a change to any of
# them would redo every record of an earlier commit. With it, the resumed run redoes what its
# params (and the triggers it is given) say, and the jobs whose outputs the pack left out.
# The checkout is made with kbfuse's own pin_kernelbench (the project installed).
set -euo pipefail
usage="usage: bash tools/resume-unpack.sh ARCHIVE MARKER"
archive=${1:?$usage}
marker=${2:?$usage}
sum=$(sha256sum "$archive" | cut -d' ' -f1)
if [ -f "$marker" ] && [ "$(cat "$marker")" = "$sum" ]; then
  echo "already unpacked on this machine: $archive"
  exit 0
fi
entries=$(tar tzf "$archive")
record=results/kernelbench/checkout.json
if printf '%s\n' "$entries" | grep -qxF "$record"; then
  [ -d .kb/KernelBench.git ] || { echo "no .kb/KernelBench.git to make $archive's KernelBench checkout from: carry .kb (tools/device-carry.sh)" >&2; exit 1; }
fi
tar xzf "$archive"
if [ -f "$record" ] && [ ! -d results/kernelbench/checkout ]; then
  pin=$(mktemp)
  python3 - "$PWD/.kb/KernelBench.git" "$record" "$pin" <<'PY'
import json, sys
from pathlib import Path
from kbfuse.tasks.kernelbench import pin_kernelbench

url, record, pin = sys.argv[1], json.loads(Path(sys.argv[2]).read_text()), Path(sys.argv[3])
pin_kernelbench(  # its own pin record goes to a temporary file: the pack's stays
    url=url, commit=record["commit"], level=record["level"],
    tasks=[int(t) for t in record["tasks"]],
    checkout="results/kernelbench/checkout", pin_json=pin,
)
PY
  rm -f "$pin"
  entries=$(printf '%s\n' "$entries"; find results/kernelbench/checkout)
fi
now=$(date +%s.%N)
printf '%s\n' "$entries" | tr '\n' '\0' | xargs -0 touch -h -d "@$now"
echo "$sum" > "$marker"
echo "unpacked $archive ($(printf '%s\n' "$entries" | wc -l) entries, their times set to now)"
