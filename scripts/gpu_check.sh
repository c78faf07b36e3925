#!/usr/bin/env bash
# The GPU machine's call: every chapter on CUDA, then bench/bench_gpu.py (issue 47).
#
# Prepare here first (python scripts/gpu_prepare.py --detach), then one call of the device tool,
# from the repository root there, carrying .whl and .gpu:
#
#     bash scripts/gpu_check.sh            # chapters, then the benchmark
#     bash scripts/gpu_check.sh chapters   # or bench: one of the two
#
# It installs the carried wheels into $GPU_SITE (default /tmp/site; a folder it finds already
# filled on a warm machine is used as it is), runs scripts/run_chapters_cuda.py for at most
# $CHAPTERS_S seconds, then the benchmark for at most $BENCH_S, and leaves in $OUT (default
# test-artifacts/gpu-check) at most six files: log.txt, summary.json, diffs.txt,
# notebooks.tar.gz, bench_gpu.json and bench_gpu.txt. Without CUDA (a rehearsal on a CPU) the
# benchmark is bench_gpu.py's smoke run.
set -u
what=${1:-all}
case $what in all | chapters | bench) ;; *) echo "usage: $0 [all|chapters|bench]" >&2; exit 2 ;; esac
out=${OUT:-$PWD/test-artifacts/gpu-check}
py=${PYTHON:-python3}
site=${GPU_SITE:-/tmp/site}
mkdir -p "$out"
exec > >(tee -a "$out/log.txt") 2>&1
echo "== $(date -u +%FT%TZ) gpu_check.sh $what on $(nproc) CPUs"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

if [ -d .whl ] && [ ! -e "$site/.done" ]; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" .whl/*.whl || exit 1
    touch "$site/.done"
fi
[ -d "$site" ] && export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}" || export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[ -d .gpu/cache ] && export GPTLIB_CACHE_DIR="$PWD/.gpu/cache"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
cuda=$("$py" -c 'import torch; print(int(torch.cuda.is_available()))') || exit 1
status=0

if [ "$what" != bench ]; then
    echo "== chapters (at most ${CHAPTERS_S:-300} s)"
    "$py" scripts/run_chapters_cuda.py --out "$out/run" --jobs "${JOBS:-4}" \
        --deadline "${CHAPTERS_S:-300}" || status=1
    mv -f "$out/run/summary.json" "$out/run/diffs.txt" "$out/" 2>/dev/null
    tar czf "$out/notebooks.tar.gz" -C "$out/run" notebooks && rm -rf "$out/run"
fi

if [ "$what" != chapters ]; then
    echo "== bench/bench_gpu.py (at most ${BENCH_S:-200} s)"
    smoke=; [ "$cuda" = 1 ] || smoke=--smoke
    timeout -k 5 "${BENCH_S:-200}" "$py" bench/bench_gpu.py $smoke --json "$out/bench_gpu.json" \
        2>&1 | tee "$out/bench_gpu.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
echo "== done, status $status"
exit $status
