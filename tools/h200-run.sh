#!/usr/bin/env bash
# One call on the offline GPU machine (see docs/device-runs.md): install kbfuse and the
# carried Snakemake wheels, run the whole study against the carried KernelBench clone,
# build the HTML report, run the GPU tests, and pack results and logs into $OUT.
#   carry: .whl (bash ../shared/device/snakemake-wheels.sh + matplotlib wheels), .kb
#   usage: bash tools/h200-run.sh [study|tests|startup|all] [pytest paths...]
#   study: the study, its report and the benchmarks that read it (tail roofline, dry-run
#   overhead, ncu of the tails); tests: the GPU tests; startup: the GPU-job start-up benchmark.
set -uo pipefail
what="${1:-all}"
shift || true
export PYTHONUNBUFFERED=1
export PATH="${CUDA_HOME:-/usr/local/cuda}/bin:$PATH"
# At most 8 files come back from the device's $OUT: everything is written to a work folder
# and packed into one archive at the end, with the three short logs beside it.
RETURN="${OUT:-/tmp/kbfuse-return}"
OUT=/tmp/kbfuse-out
mkdir -p "$OUT" "$RETURN"
commit=423217d9fda91e0c2d67e4a43bf62f96f6d104f1
stamp() { echo "== $(date -u +%FT%TZ) $*" | tee -a "$OUT/phases.txt"; }

stamp install
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"

rc=0
kb="kernelbench={url: $PWD/.kb/KernelBench, commit: $commit}"
if [ "$what" = study ] || [ "$what" = all ]; then
  stamp study start
  start=$(date +%s)
  python3 -m snakemake --cores 1 --keep-going all --config "$kb" > "$OUT/study.log" 2>&1 || rc=$?
  echo "study wall time: $(( $(date +%s) - start )) s (rc $rc)" | tee -a "$OUT/phases.txt"
  tail -n 30 "$OUT/study.log"
  stamp report
  python3 -m snakemake --report results/report.html --config "$kb" > "$OUT/report.log" 2>&1
  stamp benchmarks
  python3 benchmarks/tail_roofline.py --results results --json "$OUT/tail_roofline.json" \
    --markdown "$OUT/tail_roofline.md" 2>&1 | tee "$OUT/benchmarks.log"
  python3 benchmarks/dryrun_overhead.py -n 5 --study-dir . -- --config "$kb" 2>&1 \
    | tee -a "$OUT/benchmarks.log"
  stamp ncu
  variants=$(ls results/compile | grep -E '^(nvrtc-cubin-noftz|fast-nvrtc-cubin-noftz)$')
  timeout 120 ncu --clock-control none -k regex:'tail|triton' \
    --metrics gpu__time_duration.sum,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active \
    python3 benchmarks/tail_kernels.py --variants $variants > "$OUT/ncu.txt" 2>&1
fi
if [ "$what" = startup ]; then  # on its own: about 250 s (call 8 in docs/device-runs.md)
  stamp startup
  python3 -m snakemake --cores 4 results/kernelbench/tasks/53.json --config "$kb" > "$OUT/pin.log" 2>&1
  timeout 330 python3 benchmarks/gpu_job_startup.py --checkout results/kernelbench/checkout \
    --pin results/kernelbench/tasks/53.json --task 53 --repeats 3 \
    --json "$OUT/gpu_job_startup.json" --markdown "$OUT/gpu_job_startup.md" 2>&1 \
    | tail -n 30 | tee "$OUT/benchmarks.log"
fi
if [ "$what" = tests ] || [ "$what" = all ]; then
  stamp gpu tests
  timeout "${PYTEST_TIMEOUT:-520}" python3 -m pytest -m gpu -q -p no:cacheprovider "$@" 2>&1 | tee "$OUT/pytest-gpu.log" | tail -n 25
fi
stamp pack
tar czf "$OUT/results.tar.gz" --exclude=results/kernelbench/checkout --exclude=results/report.html \
  results .snakemake/metadata 2>/dev/null
cat "$OUT/phases.txt"
tar czf "$RETURN/out.tar.gz" -C "$OUT" .
cp "$OUT/phases.txt" "$RETURN/" 2>/dev/null
cp "$OUT/benchmarks.log" "$OUT/pytest-gpu.log" "$RETURN/" 2>/dev/null
exit $rc
