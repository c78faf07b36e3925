"""Run every chapter on the machine's device (CUDA where present) without touching the stored
outputs, and say what changed.

    python scripts/run_chapters_cuda.py [--out DIR] [--jobs N] [--deadline S] [CHAPTER ...]

Each notebook runs in a copy, in its own process and kernel (nbclient), ``--jobs`` at a time,
longest first. A chapter whose inputs are absent (they could not travel to the machine, see
``scripts/gpu_prepare.py``) is skipped and says which; one still running at ``--deadline``
seconds is stopped. DIR receives

* ``summary.json``: the device, and per chapter its status (ok, failed, skipped, stopped, not
  run), seconds, slowest cells and, when it failed, the cell and the end of the traceback;
  rewritten after each chapter;
* ``diffs.txt``: each code cell whose printed text differs from the stored output (the outputs
  nbval compares, after nbval_sanitize.cfg's replacements), as a unified diff;
* ``notebooks/``: the executed copies.

Exits 1 if a chapter failed or was stopped, 0 otherwise (skipped chapters do not count).
"""

from __future__ import annotations

import argparse
import configparser
import contextlib
import difflib
import functools
import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # IPython's colours in a traceback

# Inputs a chapter reads that may stay behind when the repository travels: paths in the
# repository, gptlib.assets names (in GPTLIB_CACHE_DIR), or "smollm2", the export of
# `python -m gptlib.gguf export` that Chapters 12 and 13 load.
NEEDS = {
    "01_tokens": ["asset:gpt2-ranks"],
    "07_sampling": ["asset:brown"],
    "08_training": ["asset:brown"],
    "09_rlhf": [f"models/rlhf/{k}.safetensors" for k in ("sft", "reward_model", "ppo", "dpo")],
    "12_todays_gpts": ["asset:smollm2-gguf", "smollm2"],
    "13_inference": ["asset:smollm2-gguf", "smollm2"],
}


def missing_inputs(stem: str) -> list[str]:
    from gptlib.assets import ASSETS, cache_dir
    from gptlib.gguf import EXPORT_NAME

    out = []
    for need in NEEDS.get(stem, []):
        if need == "smollm2":
            for suffix in ("safetensors", "tokenizer.json"):
                if not (cache_dir() / f"{EXPORT_NAME}.{suffix}").is_file():
                    out.append(f"{EXPORT_NAME}.{suffix} (python -m gptlib.gguf export)")
        elif need.startswith("asset:"):
            name = need.removeprefix("asset:")
            if not (cache_dir() / ASSETS[name].filename).is_file():
                out.append(f"{name} (gptlib.assets, in {cache_dir()})")
        elif not (ROOT / need).is_file():
            out.append(need)
    return out


@functools.cache
def sanitizers() -> list[tuple[re.Pattern, str]]:
    """nbval_sanitize.cfg's (regex, replacement) pairs, which the test suite applies too."""
    cfg = configparser.RawConfigParser()  # as nbval reads it: a % is a percent sign
    cfg.read(ROOT / "nbval_sanitize.cfg")
    return [(re.compile(cfg[s]["regex"]), cfg[s]["replace"]) for s in cfg.sections()]


def cell_text(cell) -> str:
    """The text a code cell printed: its streams joined as printed (a kernel may split one
    print over several outputs), then the text/plain of results and errors, a line each."""
    text = ""

    def line_break():
        return "\n" if text and not text.endswith("\n") else ""

    for o in cell.get("outputs", []):
        kind, part = o.get("output_type"), None
        if kind == "stream":
            text += as_str(o.get("text", ""))
            continue
        if kind in ("execute_result", "display_data"):
            data = o.get("data", {})
            if "text/plain" in data and not any(k.startswith("image/") for k in data):
                part = as_str(data["text/plain"])
        elif kind == "error":
            part = f"{o.get('ename')}: {o.get('evalue')}"
        if part is not None:
            text += line_break() + part
    text += line_break()
    for regex, replace in sanitizers():
        text = regex.sub(replace, text)
    return text


def as_str(text) -> str:
    return text if isinstance(text, str) else "".join(text)


def run_one(path: Path, out: Path, timeout: int) -> dict:
    """Execute one notebook (in this process's kernel), write the copy, return its record."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    stored = [cell_text(c) for c in nb.cells if c.cell_type == "code"]
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    t0 = time.perf_counter()
    record = {"chapter": path.stem, "status": "ok"}
    try:
        client.execute()
    except CellExecutionError as e:
        record["status"] = "failed"
        record["traceback_end"] = ANSI.sub("", str(e)).splitlines()[-25:]
    except Exception as e:  # a kernel that died, a cell past its timeout
        record["status"] = "failed"
        record["traceback_end"] = [f"{type(e).__name__}: {e}"]
    record["seconds"] = round(time.perf_counter() - t0, 1)
    code = [c for c in nb.cells if c.cell_type == "code"]
    timings = []
    for i, c in enumerate(code):
        t = c.get("metadata", {}).get("execution", {})
        start, end = t.get("iopub.execute_input"), t.get("shell.execute_reply")
        if start and end:
            dt = datetime.fromisoformat(end) - datetime.fromisoformat(start)
            timings.append((round(dt.total_seconds(), 1), i))
        if any(o.get("output_type") == "error" for o in c.get("outputs", [])):
            record["failed_cell"] = {"code_cell": i, "id": c.get("id"), "source": c.source[:400]}
    record["slowest_cells"] = [
        {"code_cell": i, "seconds": s} for s, i in sorted(timings)[-3:][::-1]
    ]
    diffs = []
    for i, (c, before) in enumerate(zip(code, stored)):
        after = cell_text(c)
        if after != before:
            lines = difflib.unified_diff(
                before.splitlines(True), after.splitlines(True), "stored", "this run", n=0
            )
            diffs.append(
                f"## {path.stem}, code cell {i} ({c.get('id')})\n" + "".join(list(lines)[:40])
            )
    record["cells_differing"] = len(diffs)
    (out / "notebooks").mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out / "notebooks" / path.name)
    (out / "notebooks" / f"{path.stem}.diff.txt").write_text("\n".join(diffs))
    return record


def scalar_chapters() -> set[str]:
    """The chapters (two digits) that `make nbval` runs on PyTorch's scalar kernels."""
    found = re.search(r"^SCALAR_CHAPTERS \?= (.*)$", (ROOT / "Makefile").read_text(), re.M)
    if found is None:
        raise SystemExit("Makefile: no SCALAR_CHAPTERS line")
    return set(found.group(1).split())


def stop(proc: subprocess.Popen) -> None:
    """Kill a worker, its kernel (which jupyter_client starts in a session of its own) and
    whatever the kernel started."""
    import psutil

    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for p in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    proc.wait()
    psutil.wait_procs(family, timeout=10)


def device_line() -> dict:
    code = (
        "import json, torch; c = torch.cuda.is_available(); print(json.dumps({'torch': "
        "torch.__version__, 'cuda': c, 'device': torch.cuda.get_device_name() if c else 'cpu'}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def write_json(path: Path, value) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=1) + "\n")
    os.replace(tmp, path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("chapters", nargs="*", help="stems such as 04_attention (default: all)")
    ap.add_argument("--out", type=Path, default=ROOT / "test-artifacts" / "cuda-run")
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--deadline", type=float, default=3600.0, help="seconds for the whole run")
    ap.add_argument("--timeout", type=int, default=600, help="seconds a cell may take")
    ap.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # a worker: one notebook
    args = ap.parse_args()
    if args.jobs < 1:
        raise SystemExit(f"--jobs must be at least 1, got {args.jobs}")

    if args.one:
        record = run_one(args.one, args.out, args.timeout)
        write_json(args.out / "notebooks" / f"{args.one.stem}.json", record)
        return 0

    paths = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"), reverse=True)
    if args.chapters:
        unknown = set(args.chapters) - {p.stem for p in paths}
        if unknown:
            raise SystemExit(f"no such chapters: {sorted(unknown)}")
        paths = [p for p in paths if p.stem in args.chapters]
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {"machine": device_line(), "jobs": args.jobs, "chapters": {}}
    print(summary["machine"], flush=True)
    records = summary["chapters"]
    queue = []
    for p in paths:
        gone = missing_inputs(p.stem)
        if gone:
            records[p.stem] = {"status": "skipped", "missing": gone}
        else:
            queue.append(p)
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    env.setdefault("PYTHONHASHSEED", "0")  # as the Makefile runs the chapters
    scalar = scalar_chapters()
    start, running = time.monotonic(), {}
    while queue or running:
        while queue and len(running) < args.jobs and time.monotonic() - start < args.deadline:
            p = queue.pop(0)
            cmd = [sys.executable, __file__, "--one", str(p), "--out", str(args.out)]
            cmd += ["--timeout", str(args.timeout)]
            # the CPU's kernels as nbval runs this chapter, so that a diff is the device's
            kernels = {"ATEN_CPU_CAPABILITY": "default"} if p.stem[:2] in scalar else {}
            running[p.stem] = (
                subprocess.Popen(cmd, env={**env, **kernels}, start_new_session=True),
                time.monotonic(),
            )
        if not running:
            break
        time.sleep(0.5)
        over = time.monotonic() - start > args.deadline
        for stem, (proc, t0) in list(running.items()):
            if proc.poll() is None and not over:
                continue
            if proc.poll() is None:
                stop(proc)
                records[stem] = {"status": "stopped", "seconds": round(time.monotonic() - t0, 1)}
            else:
                rec_path = args.out / "notebooks" / f"{stem}.json"
                if rec_path.exists():
                    records[stem] = json.loads(rec_path.read_text())
                else:
                    records[stem] = {"status": "failed", "exit_code": proc.returncode}
            del running[stem]
            r = records[stem]
            print(f"{stem:<24} {r['status']:<8} {r.get('seconds', 0):6.1f} s", flush=True)
            write_json(args.out / "summary.json", summary)
    for p in queue:
        records[p.stem] = {"status": "not run (deadline)"}
    for stem, r in records.items():
        if r["status"] == "skipped":
            print(f"{stem:<24} skipped: missing {', '.join(r['missing'])}")
    summary["seconds"] = round(time.monotonic() - start, 1)
    write_json(args.out / "summary.json", summary)
    with open(args.out / "diffs.txt", "w") as f:
        for p in sorted((args.out / "notebooks").glob("*.diff.txt")):
            text = p.read_text()
            f.write(text + "\n" if text else "")
    bad = sorted(s for s, r in records.items() if r["status"] not in ("ok", "skipped"))
    print("not ok:", bad or "none", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
