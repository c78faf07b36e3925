#!/usr/bin/env bash
# The GPU machine's call: every chapter on CUDA, then bench/bench_gpu.py (issue 47).
#
# Prepare here first (python scripts/gpu_prepare.py --detach), then one call of the device tool,
# from the repository root there, carrying .whl and .gpu:
#
#     bash scripts/gpu_check.sh            # unit tests, chapters, then the benchmark
#     bash scripts/gpu_check.sh chapters   # or unit, or bench: one of the three
#
# It installs the carried wheels into $GPU_SITE (default /tmp/site; a folder it finds already
# filled on a warm machine is used as it is), runs the unit tests that need no browser, no
# Sphinx and no git checkout (at most 90 s; test_efficiency.py has one that needs CUDA), then
# scripts/run_chapters_cuda.py for at most $CHAPTERS_S seconds, then the benchmark for at most
# $BENCH_S, and leaves in $OUT (default test-artifacts/gpu-check) at most seven files: log.txt,
# unit.txt, summary.json, diffs.txt, notebooks.tar.gz, bench_gpu.json and bench_gpu.txt.
# Without CUDA (a rehearsal on a CPU) the benchmark is bench_gpu.py's smoke run.
set -u
what=${1:-all}
case $what in all | unit | chapters | bench) ;;
*) echo "usage: $0 [all|unit|chapters|bench]" >&2; exit 2 ;;
esac
out=${OUT:-$PWD/test-artifacts/gpu-check}
py=${PYTHON:-python3}
site=${GPU_SITE:-/tmp/site}
mkdir -p "$out"

main() {
    echo "== $(date -u +%FT%TZ) gpu_check.sh $what on $(nproc) CPUs"
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    fi

    if [ -d .whl ] && [ ! -e "$site/.done" ]; then
        "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$site" .whl/*.whl || return 1
        touch "$site/.done"
    fi
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    if [ -d "$site" ]; then export PYTHONPATH="$site:$PYTHONPATH"; fi
    if [ -d .gpu/cache ]; then export GPTLIB_CACHE_DIR="$PWD/.gpu/cache"; fi
    export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
    cuda=$("$py" -c 'import torch; print(int(torch.cuda.is_available()))') || return 1
    status=0

    if [ "$what" = all ] || [ "$what" = unit ]; then
        echo "== unit tests (at most 90 s)"
        timeout -k 5 90 "$py" -m pytest -q -p no:cacheprovider -n 4 -m "not browser and not slow" \
            tests/ --ignore-glob='tests/test_browser*' --ignore=tests/test_book_ext.py \
            --ignore=tests/test_colab_setup.py --ignore=tests/test_notebook_style.py \
            --ignore=tests/test_gpu_prepare.py --ignore=tests/test_export_inputs.py \
            -rs 2>&1 | tail -40 | tee "$out/unit.txt"
        [ "${PIPESTATUS[0]}" = 0 ] || status=1
    fi

    if [ "$what" = all ] || [ "$what" = chapters ]; then
        echo "== chapters (at most ${CHAPTERS_S:-200} s)"
        timeout -k 5 $((${CHAPTERS_S:-200} + 30)) "$py" scripts/run_chapters_cuda.py \
            --out "$out/run" --jobs "${JOBS:-4}" --deadline "${CHAPTERS_S:-200}" || status=1
        mv -f "$out/run/summary.json" "$out/run/diffs.txt" "$out/" 2>/dev/null
        tar czf "$out/notebooks.tar.gz" -C "$out/run" notebooks && rm -rf "$out/run"
    fi

    if [ "$what" = all ] || [ "$what" = bench ]; then
        echo "== bench/bench_gpu.py (at most ${BENCH_S:-240} s)"
        smoke=; [ "$cuda" = 1 ] || smoke=--smoke
        timeout -k 5 "${BENCH_S:-240}" "$py" bench/bench_gpu.py $smoke \
            --json "$out/bench_gpu.json" 2>&1 | tee "$out/bench_gpu.txt"
        [ "${PIPESTATUS[0]}" = 0 ] || status=1
    fi
    echo "== done, status $status"
    return $status
}

main 2>&1 | tee -a "$out/log.txt"
exit "${PIPESTATUS[0]}"
