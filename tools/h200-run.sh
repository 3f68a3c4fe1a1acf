#!/usr/bin/env bash
# One call on the offline GPU machine (see docs/device-runs.md): install kbfuse and the
# carried Snakemake wheels, run the whole study against the carried KernelBench clone,
# build the HTML report, run the GPU tests, and pack results and logs into $OUT.
#   carry: .whl (the Snakemake wheels), .kb (a clone of KernelBench at the pin), .nvrtc12,
#   .bwrap (bubblewrap for kbfuse check's sandbox, as Debian .debs: see below)
#   usage: bash tools/h200-run.sh MODES [pytest paths...], MODES a comma-separated list of
#   study: the study (--cores $STUDY_CORES, default every core) and its HTML report; benchmarks: the benchmarks that read the study's
#   results (tail roofline, dry-run overhead, ncu of the tails); tests: the GPU tests (with a
#   time limit of $PYTEST_TIMEOUT s); startup: the GPU-job start-up benchmark; all: study,
#   benchmarks and tests; fused2-ncu: the second study's fast tails under Nsight Compute
#   (after its run); survey: `snakemake survey` (extra --config items in $SURVEY_CONFIG,
#   a time limit of $SURVEY_TIMEOUT s). Without pytest paths, tests runs every GPU test, those
#   of test_compile.py in a process of their own first.
# Runs longer than one call (10 minutes) go to the background, where they outlive the call on
# the warm machine (it keeps processes and files for a short while between calls):
#   bg-survey, bg-study, bg-fused2, bg-check, bg-audit, bg-tests: start `snakemake survey` (and
#   the environment fingerprint), `all`, `fused2` (the second fused study, docs/fused2.md),
#   `check` (every core) or `audit` of CUDA-L1's H100 kernels (carried as
#   .corpus/cuda_l1_h100.json.xz), or every GPU test, in
#   the background, with fresh compile caches for the study; wait: wait for every background
#   run until $WAIT_UNTIL s into the call (default 560). Their logs, start and end times and
#   exit codes are in /tmp/kbfuse-bg and come back in the archive. A later call skips the
#   install when the machine still has it.
set -uo pipefail
what="${1:-all}"
shift || true
[ "$what" = all ] && what=study,benchmarks,tests
has() { case ",$what," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
# shellcheck source=tools/device-settings.sh
source tools/device-settings.sh  # the corpus path, the resume's triggers, the audit's items
export PYTHONUNBUFFERED=1
# one folder of GPU locks and scratch reservations for every job of the call, whatever TMPDIR
# a phase runs with (the tests below have their own)
export KBFUSE_GPU_LOCK_DIR="${KBFUSE_GPU_LOCK_DIR:-${TMPDIR:-/tmp}}"
export PATH="${CUDA_HOME:-/usr/local/cuda}/bin:$PATH"
# At most 8 files come back from the device's $OUT: everything is written to a work folder
# and packed into one archive at the end, with the three short logs beside it.
RETURN="${OUT:-/tmp/kbfuse-return}"
OUT=/tmp/kbfuse-out
mkdir -p "$OUT" "$RETURN"
commit=$(python3 -c 'import yaml; print(yaml.safe_load(open("config/config.yaml"))["kernelbench"]["commit"])')
stamp() { echo "== $(date -u +%FT%TZ) $*" | tee -a "$OUT/phases.txt"; }

stamp install
if [ -f /tmp/kbfuse-installed ]; then
  export PYTHONPATH=/tmp/site
  echo "install: already there (warm machine)" | tee -a "$OUT/phases.txt"
else
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
  python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
  touch /tmp/kbfuse-installed
fi
# NVRTC 12.9 (the nvrtc12-* variants) travels as its two libraries, xz-compressed, in
# .nvrtc12/ (unzip the nvidia-cuda-nvrtc-cu12 12.9.86 wheel's nvidia/cuda_nvrtc/lib/*.so*).
if [ -d .nvrtc12 ]; then
  mkdir -p /tmp/nvrtc12 && for f in .nvrtc12/*.xz; do xz -dc "$f" > "/tmp/nvrtc12/$(basename "$f" .xz)"; done
  export KBFUSE_NVRTC_PATH=/tmp/nvrtc12
fi
# bubblewrap, the sandbox of kbfuse check (docs/check.md). The machine has no package index:
# Debian's .debs travel in .bwrap/ (here: apt-get download bubblewrap libcap2 libselinux1
# libpcre2-8-0) and are unpacked into a folder of their own, never into /; bwrap starts through
# the dynamic loader with that folder's libraries, so nothing else sees them (KBFUSE_BWRAP).
if [ -d .bwrap ] && ! command -v bwrap > /dev/null; then
  rm -rf /tmp/bwrap && mkdir -p /tmp/bwrap && for f in .bwrap/*.deb; do dpkg -x "$f" /tmp/bwrap; done
  libs=/tmp/bwrap/usr/lib/x86_64-linux-gnu:/tmp/bwrap/lib/x86_64-linux-gnu
  printf '#!/bin/sh\nexec /lib64/ld-linux-x86-64.so.2 --library-path %s /tmp/bwrap/usr/bin/bwrap "$@"\n' \
    "$libs" > /tmp/bwrap/bwrap && chmod +x /tmp/bwrap/bwrap
  export KBFUSE_BWRAP=/tmp/bwrap/bwrap
  "$KBFUSE_BWRAP" --version | tee -a "$OUT/phases.txt"
fi
# CUDA-L1's H100 kernels (github deepreinforce-ai/CUDA-L1, optimized_cuda_code/h100.json) travel
# xz-compressed as .corpus/cuda_l1_h100.json.xz (3.3 MB of JSON in 0.24 MB, so that the call stays
# under its 64 MiB): the audit's GPU test and `bg-audit` read them from /tmp/corpus.
if [ -f .corpus/cuda_l1_h100.json.xz ]; then
  mkdir -p "$(dirname "$DEVICE_CORPUS")" && xz -dc .corpus/cuda_l1_h100.json.xz > "$DEVICE_CORPUS"
  export KBFUSE_AUDIT_CUDA_L1="$DEVICE_CORPUS"
fi
# resume/results.tar.gz (RESUME_PACK; tracked: tools/resume-pack.sh makes it from a returned
# archive, and an empty RESUME_PACK starts afresh): an earlier call's results and .snakemake,
# unpacked once per machine before anything runs, with the KernelBench checkout made again from
# .kb, so that a background run an ended machine cut short goes on where it stopped
# (tools/resume-unpack.sh: why the files' times are set to now), with the triggers of
# tools/device-settings.sh (resume_triggers: why not the set of inputs).
RESUME_TRIGGERS=()
pack="${RESUME_PACK-resume/results.tar.gz}"
if [ -n "$pack" ] && [ -f "$pack" ]; then
  bash tools/resume-unpack.sh "$pack" /tmp/kbfuse-resumed | tee -a "$OUT/phases.txt" || exit 1
  # shellcheck disable=SC2206  # the triggers: words on purpose
  RESUME_TRIGGERS=(--rerun-triggers $(resume_triggers))
  echo "resumed from $pack (tools/resume-pack.sh):" \
    "$(find results/audit -path '*/verdicts/*.json' 2> /dev/null | wc -l) audit verdicts," \
    "$(find results/survey -path '*/tasks/*.json' 2> /dev/null | wc -l) survey records" \
    | tee -a "$OUT/phases.txt"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
# the scratch disk free: session 21's machine had 3.2 GB (four audit checks refused for it)
echo "scratch disk (${TMPDIR:-/tmp}): $(df -h --output=avail,size "${TMPDIR:-/tmp}" | tail -n 1)" \
  | tee -a "$OUT/phases.txt"
echo "/dev/shm: $(df -h --output=avail,size /dev/shm | tail -n 1); memory: $(free -g | awk 'NR == 2 { print $2 " GB, " $7 " available" }')" \
  | tee -a "$OUT/phases.txt"

rc=0
kb="kernelbench={url: $PWD/.kb/KernelBench.git, commit: $commit}"
if has study; then
  stamp study start
  start=$(date +%s)
  python3 -m snakemake --cores "${STUDY_CORES:-$(nproc)}" --keep-going all --config "$kb" > "$OUT/study.log" 2>&1 || rc=$?
  echo "study wall time: $(( $(date +%s) - start )) s (rc $rc)" | tee -a "$OUT/phases.txt"
  tail -n 30 "$OUT/study.log"
  stamp report
  python3 -m snakemake --report results/report.html --config "$kb" > "$OUT/report.log" 2>&1
fi
if has benchmarks; then
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
if has fused2-ncu; then  # after `snakemake fused2` (its results/fused2): the fast tails under ncu
  stamp fused2-ncu
  timeout 240 ncu --clock-control none -k regex:'tail|stage' \
    --metrics gpu__time_duration.sum,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active \
    python3 benchmarks/tail_kernels.py --results results/fused2 --tasks 4 65 \
    --numerics kernelbench-defaults strict --variants fast-nvrtc-cubin-noftz \
    > "$OUT/ncu-fused2.txt" 2>&1
  tail -n 40 "$OUT/ncu-fused2.txt"
fi
if has startup; then  # on its own: about 250 s (call 8 in docs/device-runs.md)
  stamp startup
  python3 -m snakemake --cores 4 results/kernelbench/tasks/53.json --config "$kb" > "$OUT/pin.log" 2>&1
  timeout 330 python3 benchmarks/gpu_job_startup.py --checkout results/kernelbench/checkout \
    --pin results/kernelbench/tasks/53.json --task 53 --repeats 3 \
    --json "$OUT/gpu_job_startup.json" --markdown "$OUT/gpu_job_startup.md" 2>&1 \
    | tail -n 30 | tee "$OUT/benchmarks.log"
fi
if has tests; then
  stamp gpu tests
  # CALL_BUDGET_S: the whole call's limit; the tests get what the steps before them left.
  limit="${PYTEST_TIMEOUT:-520}"
  [ -n "${CALL_BUDGET_S:-}" ] && limit=$(( CALL_BUDGET_S - SECONDS ))
  echo "gpu tests: time limit ${limit} s" | tee -a "$OUT/phases.txt"
  start_tests=$SECONDS
  # The tests' files (pytest's tmp_path, the checks' scratch) go to a folder removed after
  # them: a test stopped by the limit leaves its checks' case outputs behind (session 22: 39 GB,
  # which a background audit after it then lacked).
  tests_tmp="${TMPDIR:-/tmp}/kbfuse-tests"
  rm -rf "$tests_tmp" && mkdir -p "$tests_tmp"
  run_pytest() {
    TMPDIR="$tests_tmp" timeout "$(( limit - SECONDS + start_tests ))" \
      python3 -m pytest -m gpu -v -p no:cacheprovider \
      --durations=15 "$@" 2>&1 | tee -a "$OUT/pytest-gpu.log" \
      | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" | tail -n 60
  }
  if [ $# -eq 0 ]; then
    # test_compile's GPU tests need a process where CUDA has not started: first, alone.
    run_pytest tests/test_compile.py
    run_pytest --ignore=tests/test_compile.py tests
  else
    run_pytest "$@"
  fi
  rm -rf "$tests_tmp"
  echo "scratch disk after the tests: $(df -h --output=avail "${TMPDIR:-/tmp}" | tail -n 1)" \
    | tee -a "$OUT/phases.txt"
fi
if has survey; then
  # SURVEY_CONFIG: extra --config items, e.g. 'survey={tasks: [1, 53]}'
  stamp survey
  start=$(date +%s)
  timeout -k 15 "${SURVEY_TIMEOUT:-540}" python3 -m snakemake --cores "$(nproc)" --keep-going survey \
    --config "$kb" ${SURVEY_CONFIG:+"$SURVEY_CONFIG"} > "$OUT/survey.log" 2>&1 || rc=$?
  echo "survey wall time: $(( $(date +%s) - start )) s (rc $rc)" | tee -a "$OUT/phases.txt"
  tail -n 20 "$OUT/survey.log"
fi
bg=/tmp/kbfuse-bg
start_bg() {  # NAME COMMAND...: run COMMAND in its own session, past the end of this call
  local name=$1
  shift
  mkdir -p "$bg"
  rm -f "$bg/$name.end" "$bg/$name.rc"  # an earlier run of that name on this warm machine
  date +%s > "$bg/$name.start"
  stamp "background $name: $*"
  setsid nohup bash -c '"$@"; echo $? > '"$bg/$name.rc"'; date +%s > '"$bg/$name.end" \
    _ "$@" > "$bg/$name.log" 2>&1 < /dev/null &
}
snake() { python3 -m snakemake --cores "$(nproc)" --keep-going "$@" --config "$kb"; }
# every GPU test in one background run: test_compile's first, in a process where CUDA has not
# started, then the rest (pytest's own summary lines say what passed, failed or was skipped)
# (BG_TESTS: those pytest paths only, e.g. beside a background audit, whose GPU lock and scratch
# ledger they share)
gpu_tests() {
  if [ -n "${BG_TESTS:-}" ]; then
    # shellcheck disable=SC2086  # the paths: words on purpose
    python3 -m pytest -m gpu -p no:cacheprovider -rA --durations=20 $BG_TESTS
    return
  fi
  python3 -m pytest -m gpu -p no:cacheprovider -rA --durations=20 tests/test_compile.py
  local first=$?
  python3 -m pytest -m gpu -p no:cacheprovider -rA --durations=20 --ignore=tests/test_compile.py tests
  local rest=$?
  return $(( first || rest ))
}
export kb
export -f snake gpu_tests
# the survey reference (tools/survey_reference.py) needs the machine's fingerprint too
# (SURVEY_CONFIG: extra --config items, as for survey above; SURVEY_NEXT_CONFIG: when set, a
# second survey with those items once the first has ended, e.g. level 3 after level 2, so that
# it starts without waiting for the next call)
# SURVEY_JOBS: task jobs at a time (the profile's gpu_jobs, 6, by default): more jobs share
# each window between two jobs' alone phases (docs/survey.md, "Wall time")
resume_triggers="${RESUME_TRIGGERS[*]}"
survey_once() {  # [CONFIG_ITEM]
  # shellcheck disable=SC2086  # resume_triggers: words on purpose
  python3 -m snakemake --cores "$(nproc)" --keep-going survey results/env/fingerprint.json \
    $resume_triggers ${SURVEY_JOBS:+--resources gpu=1 "gpu_jobs=$SURVEY_JOBS"} \
    --config "$kb" ${1:+"$1"}
}
surveys() {
  echo "== $(date -u +%FT%TZ) survey: ${SURVEY_CONFIG:-config/config.yaml as it is}"
  survey_once "${SURVEY_CONFIG:-}"
  local first=$?
  [ -z "${SURVEY_NEXT_CONFIG:-}" ] && return $first
  echo "== $(date -u +%FT%TZ) survey (rc $first), then: $SURVEY_NEXT_CONFIG"
  survey_once "$SURVEY_NEXT_CONFIG"
  local next=$?
  return $(( first || next ))
}
export resume_triggers
export -f survey_once surveys
if has bg-survey; then start_bg survey surveys; fi
if has bg-check; then start_bg check snake check; fi
if has bg-tests; then start_bg tests gpu_tests; fi
if has bg-study; then
  mkdir -p /tmp/study-caches
  start_bg study env TORCHINDUCTOR_CACHE_DIR=/tmp/study-caches/inductor \
    TRITON_CACHE_DIR=/tmp/study-caches/triton python3 -m snakemake --cores "$(nproc)" \
    --keep-going all --config "$kb"
fi
if has bg-audit; then  # CUDA-L1's H100 level-2 kernels, checked on this GPU (docs/audit.md)
  # AUDIT_JOBS: checks at a time (the profile's gpu_jobs, 6 by default; session 12 ran 6);
  # AUDIT_SPREAD: check.timing.spread (rounds sized from the spread; unset: fixed rounds)
  # (and the machine's fingerprint, which the reference needs: tools/audit_reference.py);
  # AUDIT_SCRATCH: the checks' scratch roots (KBFUSE_SCRATCH; default TMPDIR), e.g.
  # /dev/shm:/tmp, the machine's memory first (faster, and room for one of the largest tasks
  # beside one on the disk: kbfuse.candidates.diskbudget keeps memory for the processes);
  # scratch_mb: the room of those roots now (`kbfuse scratch`), shared out by each check's estimate;
  # AUDIT_THEN_SURVEY: a survey config item (e.g. 'survey={level: 3}'): the same background job
  # runs `snakemake survey` with it as soon as the audit's run ends, without waiting for the
  # next call (not beside it: a survey's compiles and max-autotune would take the memory a
  # check's scratch in /dev/shm was granted by, and two Snakemake runs in one working
  # directory lock each other out)
  [ -n "${AUDIT_SCRATCH:-}" ] && export KBFUSE_SCRATCH="$AUDIT_SCRATCH"
  python3 -m kbfuse.workflow.cli scratch | tee -a "$OUT/phases.txt"
  audit_scratch_mb=$(python3 -m kbfuse.workflow.cli scratch --mb) || exit 1
  export audit_scratch_mb
  audit_run() {  # in start_bg's own bash: exported names only
    local audit_config
    mapfile -t audit_config < <(audit_items)
    # shellcheck disable=SC2086  # resume_triggers: words on purpose
    python3 -m snakemake --cores "$(nproc)" --keep-going audit results/env/fingerprint.json \
      $resume_triggers \
      --resources gpu=1 "gpu_jobs=${AUDIT_JOBS:-6}" "scratch_mb=$audit_scratch_mb" --config "$kb" \
      "${audit_config[@]}"
    local audited=$?
    [ -z "${AUDIT_THEN_SURVEY:-}" ] && return $audited
    echo "== $(date -u +%FT%TZ) audit (rc $audited), then the survey: $AUDIT_THEN_SURVEY"
    survey_once "$AUDIT_THEN_SURVEY"
    local surveyed=$?
    return $(( audited || surveyed ))
  }
  export DEVICE_CORPUS
  export -f audit_run audit_items
  start_bg audit audit_run
fi
if has bg-fused2; then
  mkdir -p /tmp/fused2-caches
  start_bg fused2 env TORCHINDUCTOR_CACHE_DIR=/tmp/fused2-caches/inductor \
    TRITON_CACHE_DIR=/tmp/fused2-caches/triton python3 -m snakemake --cores "$(nproc)" \
    --keep-going fused2 --config "$kb"
fi
# A call can be stopped before WAIT_UNTIL (its limit is the session's device time left, the
# machine's start included: session 13's third call was stopped at 482 s and returned nothing),
# so the wait leaves a snapshot of the results and logs in the returned folder every minute.
snapshot() {
  tar czf "$RETURN/partial.tar.gz.tmp" --exclude=results/kernelbench/checkout \
    --exclude=results/report.html --exclude=results/survey/.cache results .snakemake/log \
    "$bg" 2>/dev/null
  mv "$RETURN/partial.tar.gz.tmp" "$RETURN/partial.tar.gz"
}
if has wait; then
  stamp wait
  while [ "$SECONDS" -lt "${WAIT_UNTIL:-560}" ]; do
    running=0
    for f in "$bg"/*.start; do [ -e "$f" ] && [ ! -e "${f%.start}.end" ] && running=1; done
    [ "$running" = 0 ] && break
    sleep 5
    if [ $(( SECONDS % 60 )) -lt 5 ]; then snapshot; fi
  done
  rm -f "$RETURN/partial.tar.gz"  # the full pack below replaces it
fi
if [ -d "$bg" ]; then
  for f in "$bg"/*.start; do
    [ -e "$f" ] || continue
    n=$(basename "$f" .start)
    if [ -e "$bg/$n.end" ]; then
      echo "background $n: $(( $(cat "$bg/$n.end") - $(cat "$f") )) s, rc $(cat "$bg/$n.rc")"
    else
      echo "background $n: running for $(( $(date +%s) - $(cat "$f") )) s"
    fi | tee -a "$OUT/phases.txt"
    tail -n 5 "$bg/$n.log"
  done
  cp -r "$bg" "$OUT/background"
fi
stamp pack
tar czf "$OUT/results.tar.gz" --exclude=results/kernelbench/checkout --exclude=results/report.html \
  --exclude=results/survey/.cache results .snakemake/metadata .snakemake/log 2>/dev/null
cat "$OUT/phases.txt"
tar czf "$RETURN/out.tar.gz" -C "$OUT" .
cp "$OUT/phases.txt" "$RETURN/" 2>/dev/null
cp "$OUT/benchmarks.log" "$OUT/pytest-gpu.log" "$RETURN/" 2>/dev/null
exit $rc
