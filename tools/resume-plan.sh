#!/usr/bin/env bash
# What the next device call's resumed run would do, planned here before any device time is
# spent: a clone of this checkout's HEAD in a temporary folder, resume/results.tar.gz unpacked
# into it as tools/h200-run.sh unpacks it (tools/resume-unpack.sh), then a Snakemake dry run of
# TARGET with the triggers and items h200-run.sh gives it (tools/device-settings.sh). Prints
# the jobs it would run by rule, then their reasons counted. Session 26 learnt on the device,
# two calls late, that its resumed audit was redoing 55 finished verdicts.
#   usage: bash tools/resume-plan.sh TARGET [CONFIG_ITEM...]
#   TARGET `audit` reads the carried corpus (.corpus/cuda_l1_h100.json.xz) and passes
#   h200-run.sh's audit items (and AUDIT_SPREAD's); any other target gets the KernelBench item
#   and the CONFIG_ITEMs only (e.g. survey 'survey={level: 3}').
#   needs: python3 with Snakemake and kbfuse (the project installed); .kb/KernelBench.git when
#   the pack has a KernelBench pin record.
set -euo pipefail
target=${1:?usage: bash tools/resume-plan.sh TARGET [CONFIG_ITEM...]}
shift
[ -f resume/results.tar.gz ] || { echo "no resume/results.tar.gz here: nothing to resume" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git clone -q . "$work/repo"
for carried in .kb .corpus; do  # carried to the device, not tracked
  if [ -e "$carried" ]; then cp -r "$carried" "$work/repo/$carried"; fi
done
cd "$work/repo"
# shellcheck source=tools/device-settings.sh
source tools/device-settings.sh
bash tools/resume-unpack.sh resume/results.tar.gz "$work/marker" >&2
items=()
if [ -f config/config.yaml ]; then
  pin=$(python3 -c 'import yaml; print(yaml.safe_load(open("config/config.yaml"))["kernelbench"]["commit"])')
  items+=("kernelbench={url: $PWD/.kb/KernelBench.git, commit: $pin}")
fi
if [ "$target" = audit ]; then
  mkdir -p "$(dirname "$DEVICE_CORPUS")"
  xz -dc .corpus/cuda_l1_h100.json.xz > "$DEVICE_CORPUS"
  mapfile -t -O "${#items[@]}" items < <(audit_items)
fi
items+=("$@")
config=()
[ ${#items[@]} -gt 0 ] && config=(--config "${items[@]}")
# shellcheck disable=SC2086  # the triggers: words on purpose
python3 -m snakemake --dry-run --cores 1 "$target" \
  --rerun-triggers $(resume_triggers) "${config[@]}" > "$work/plan.log" 2>&1 \
  || { cat "$work/plan.log" >&2; exit 1; }
awk '/^Job stats:/ {on = 1} on {print} on && /^total/ {exit}' "$work/plan.log"
echo "reasons:"
grep -o 'reason: [A-Za-z ]*' "$work/plan.log" | sort | uniq -c | sort -rn || echo "      0 (nothing to do)"
