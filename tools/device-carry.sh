#!/usr/bin/env bash
# Make, in a fresh checkout, the folders a call on the offline GPU machine carries
# (tools/h200-run.sh reads them; docs/device-runs.md): none is tracked, each is listed in
# .git/info/exclude. Run from the repository's root, on an amd64 machine with network:
#   bash tools/device-carry.sh KERNELBENCH CUDA_L1 WHEELS_SCRIPT
# KERNELBENCH, CUDA_L1: a git directory (bare or not) or URL of ScalingIntelligence/KernelBench
# and of deepreinforce-ai/CUDA-L1; WHEELS_SCRIPT: the script that fills .whl/ with Snakemake's
# wheels for that machine's Python 3.12 (the workplace's; its header shows the install line).
# Makes:
#   .kb/KernelBench.git  a bare git directory holding the pinned commit alone (config/config.yaml's
#                    kernelbench.commit), the kernelbench.url tools/h200-run.sh and the GPU tests use
#   .whl             Snakemake's wheels, and einops's
#   .bwrap           Debian's bubblewrap and its libraries, as .debs (kbfuse check's sandbox)
#   .nvrtc12         NVRTC 12.9's two libraries, xz-compressed (the nvrtc12-* variants)
#   .corpus          CUDA-L1's H100 kernels, optimized_cuda_code/h100.json, xz-compressed
# Then carry what a call needs, within its 64 MiB with the tracked tree (about 22 MB): the
# study .whl .kb .nvrtc12, a check or the audit .whl .kb .bwrap .corpus; the sizes are
# printed at the end.
set -euo pipefail
[ $# -eq 3 ] || { sed -n '2,17p' "$0"; exit 2; }
kernelbench=$1 cuda_l1=$2 wheels=$3
[ -f config/config.yaml ] || { echo "device-carry: run from the repository's root" >&2; exit 2; }
[ -f "$wheels" ] || { echo "device-carry: no wheels script at $wheels" >&2; exit 2; }
commit=$(python3 -c 'import yaml; print(yaml.safe_load(open("config/config.yaml"))["kernelbench"]["commit"])')
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source_of() { if [ -d "$1" ]; then realpath "$1"; else echo "$1"; fi; }  # a folder or a URL

for name in .whl .kb .bwrap .nvrtc12 .corpus; do
  grep -qxF "/$name/" .git/info/exclude 2>/dev/null || echo "/$name/" >> .git/info/exclude
done

echo "device-carry: .kb/KernelBench.git at $commit"
rm -rf .kb && git init -q --bare .kb/KernelBench.git
git -C .kb/KernelBench.git fetch -q --depth 1 "$(source_of "$kernelbench")" "$commit:refs/heads/pinned"

echo "device-carry: .whl"
rm -rf .whl && bash "$wheels"
# einops: a dependency of kbfuse (KernelBench's level-3 Mamba2 task files import it) that the
# GPU machine lacks
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .whl "einops>=0.8"
# pulp's wheel is 16 MB of CBC solver binaries Snakemake's greedy scheduler never runs: left
# out (with their RECORD lines) so that a call's tree stays under its 64 MiB
python3 - .whl/pulp-*.whl <<'PY'
import sys, zipfile
for path in sys.argv[1:]:
    with zipfile.ZipFile(path) as z:
        kept = {n: z.read(n) for n in z.namelist() if "/solverdir/cbc/" not in n}
    for name in [n for n in kept if n.endswith(".dist-info/RECORD")]:
        lines = kept[name].decode().splitlines(keepends=True)
        kept[name] = "".join(line for line in lines if "/solverdir/cbc/" not in line).encode()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in kept.items():
            z.writestr(name, data)
PY

echo "device-carry: .bwrap"
rm -rf .bwrap && mkdir .bwrap
(cd .bwrap && apt-get download -qq bubblewrap libcap2 libselinux1 libpcre2-8-0 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)

echo "device-carry: .nvrtc12"
rm -rf .nvrtc12 && mkdir .nvrtc12
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 nvidia-cuda-nvrtc-cu12==12.9.86 -d "$tmp/nvrtc"
python3 - "$tmp/nvrtc" .nvrtc12 <<'EOF'
import lzma, pathlib, sys, zipfile
wheel, out = next(pathlib.Path(sys.argv[1]).glob("*.whl")), pathlib.Path(sys.argv[2])
with zipfile.ZipFile(wheel) as z:
    libs = [
        n for n in z.namelist()
        if n.startswith("nvidia/cuda_nvrtc/lib/") and ".so" in n and ".alt." not in n
    ]
    for name in libs:
        (out / (pathlib.Path(name).name + ".xz")).write_bytes(lzma.compress(z.read(name), preset=6))
if len(libs) != 2:
    sys.exit(f"device-carry: expected NVRTC's two libraries in {wheel.name}, found {libs}")
EOF

echo "device-carry: .corpus"
rm -rf .corpus && mkdir .corpus
git init -q "$tmp/cuda_l1"
git -C "$tmp/cuda_l1" fetch -q --depth 1 "$(source_of "$cuda_l1")" HEAD
git -C "$tmp/cuda_l1" show FETCH_HEAD:optimized_cuda_code/h100.json > "$tmp/h100.json"
xz -c "$tmp/h100.json" > .corpus/cuda_l1_h100.json.xz

du -sh .whl .kb .bwrap .nvrtc12 .corpus
