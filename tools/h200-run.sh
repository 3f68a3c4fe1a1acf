#!/usr/bin/env bash
# One call on the offline GPU machine (see docs/device-runs.md): install kbfuse and the
# carried Snakemake wheels, run the whole study against the carried KernelBench clone,
# build the HTML report, run the GPU tests, and pack results and logs into $OUT.
#   carry: .whl (bash ../shared/device/snakemake-wheels.sh + matplotlib wheels), .kb
#   usage: bash tools/h200-run.sh [study|tests|all] [pytest paths...]
set -uo pipefail
what="${1:-all}"
shift || true
export PYTHONUNBUFFERED=1
export PATH="${CUDA_HOME:-/usr/local/cuda}/bin:$PATH"
OUT="${OUT:-/tmp/kbfuse-out}"
mkdir -p "$OUT"
commit=423217d9fda91e0c2d67e4a43bf62f96f6d104f1
stamp() { echo "== $(date -u +%FT%TZ) $*" | tee -a "$OUT/phases.txt"; }

stamp install
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"

rc=0
if [ "$what" != tests ]; then
  stamp study start
  start=$(date +%s)
  python3 -m snakemake --cores 4 --keep-going all \
    --config kernelbench="{url: $PWD/.kb/KernelBench, commit: $commit}" \
    > "$OUT/study.log" 2>&1 || rc=$?
  echo "study wall time: $(( $(date +%s) - start )) s (rc $rc)" | tee -a "$OUT/phases.txt"
  tail -n 40 "$OUT/study.log"
  stamp report
  python3 -m snakemake --report results/report.html \
    --config kernelbench="{url: $PWD/.kb/KernelBench, commit: $commit}" > "$OUT/report.log" 2>&1
fi
if [ "$what" != study ]; then
  stamp gpu tests
  timeout 400 python3 -m pytest -m gpu -q -p no:cacheprovider "$@" 2>&1 | tee "$OUT/pytest-gpu.log" | tail -n 25
fi
stamp pack
tar czf "$OUT/results.tar.gz" --exclude=results/kernelbench/checkout results .snakemake/metadata 2>/dev/null
cat "$OUT/phases.txt"
exit $rc
