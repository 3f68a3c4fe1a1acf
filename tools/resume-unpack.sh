#!/usr/bin/env bash
# Unpack a resume archive (tools/resume-pack.sh) into the working tree, once per machine, and
# give every file it holds one time: now.
#   usage: bash tools/resume-unpack.sh ARCHIVE MARKER
# MARKER (a file outside the working tree) keeps the archive's checksum: a later call on the
# same warm machine unpacks nothing, so the archive never overwrites what a run still going in
# the background has written since.
# One time for all, later than the working tree's copy: Snakemake reruns a job whose input file
# is newer than its output and differs from the recorded checksum, whatever --rerun-triggers
# says (snakemake/snakemake#2328). The working tree here is copied fresh at every call, so
# without this every source file a record depends on would be "newer", and a change to any of
# them would redo every record of an earlier commit. With it, the resumed run redoes what its
# params, its set of inputs or its software say, and the jobs whose outputs the pack left out.
set -euo pipefail
usage="usage: bash tools/resume-unpack.sh ARCHIVE MARKER"
archive=${1:?$usage}
marker=${2:?$usage}
sum=$(sha256sum "$archive" | cut -d' ' -f1)
if [ -f "$marker" ] && [ "$(cat "$marker")" = "$sum" ]; then
  echo "already unpacked on this machine: $archive"
  exit 0
fi
tar xzf "$archive"
now=$(date +%s)
entries=$(tar tzf "$archive")
printf '%s\n' "$entries" | tr '\n' '\0' | xargs -0 touch -h -d "@$now"
echo "$sum" > "$marker"
echo "unpacked $archive ($(printf '%s\n' "$entries" | wc -l) entries, their times set to now)"
