"""The command line: ``python -m gptlib.export MODEL_DIR OUT_DIR`` and
``python -m gptlib.export --smollm2 OUT_DIR`` (what ``make book`` runs) write a model's ONNX step
graph, tokenizer.json and manifest for the page."""

from __future__ import annotations

import argparse

from .write import export, export_smollm2

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gptlib.export",
        description="Write a model's ONNX step graph, tokenizer.json and manifest for the page.",
    )
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="MODEL_DIR OUT_DIR (a directory written by GPT.save, with tokenizer.json), or "
        "OUT_DIR with --smollm2",
    )
    parser.add_argument(
        "--smollm2", action="store_true", help="export SmolLM2-135M-Instruct from the cache"
    )
    parser.add_argument(
        "--name", default=None, help="file names (default: the model directory's name; smollm2)"
    )
    args = parser.parse_args(argv)
    if len(args.paths) != (1 if args.smollm2 else 2):
        parser.error("give MODEL_DIR OUT_DIR, or --smollm2 OUT_DIR")
    if args.smollm2:
        written = export_smollm2(args.paths[0], args.name or "smollm2")
    else:
        written = export(args.paths[0], args.paths[1], args.name)
    for path in written:
        print(f"wrote {path} ({path.stat().st_size:,} bytes)")
    return 0
