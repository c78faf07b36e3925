"""Infrastructure: the book's models in the browser — the live step (:func:`gptlib.step.step`) as
an ONNX graph, the tokenizer.json and a manifest, for the English GPT and SmolLM2-135M-Instruct.

The live playground of the HTML book (:class:`gptlib.widgets.PlaygroundView`) runs a model with
onnxruntime-web and its BPE with @huggingface/tokenizers, both vendored from npm; in a Jupyter
kernel the same widget calls :func:`gptlib.step.step` in PyTorch. This package writes what the page
reads, one module per file:

* ``<name>.onnx.0``, ``.1``, ...: :mod:`~gptlib.export.graph` (:func:`to_onnx`),
  ``torch.onnx.export`` of the step, which composes the model's own modules, so the PyTorch
  model stays the only definition of the maths. The English model's weights that float16 holds
  exactly are stored as float16; SmolLM2's are float32 initializers stored externally, which
  the page unpacks from the GGUF's own Q4_1 and Q8_0 blocks, ``<name>.blocks.0``, ...
  (:mod:`~gptlib.export.q4`). The serialized graph and the blocks are cut into pieces of at
  most :data:`PIECE_BYTES` bytes (a static host's file limit).
  The bytes are deterministic.
* ``<name>.tokenizer.json``: :mod:`~gptlib.export.tokenizer`, the tokenizer in Hugging Face's
  ``tokenizer.json`` format (:func:`tokenizer_json`, :func:`gguf_tokenizer_json`).
* ``<name>.json``: :mod:`~gptlib.export.manifest` (:func:`manifest`): the config, the files and
  their SHA-256, every token as a string and as bytes, the special tokens, the chat template's
  prefix and suffix, and :func:`weights_sha256`, which a widget compares with the model it was
  made from.

:mod:`~gptlib.export.write` writes the three (:func:`export`, :func:`export_smollm2`), and
:mod:`~gptlib.export.cli` is the command line: ``make book`` runs
``python -m gptlib.export models/english book_static/live`` and
``python -m gptlib.export --smollm2 book_static/live``; nothing they write is committed.
"""

from __future__ import annotations

from ..step import INPUTS, LENS_TOP, OUTPUTS
from .cli import main
from .graph import to_onnx, to_onnx_gguf
from .manifest import chat_frame, manifest, weights_sha256
from .tokenizer import gguf_tokenizer_json, tokenizer_json
from .write import PIECE_BYTES, export, export_smollm2, pieces

__all__ = [
    "INPUTS",
    "OUTPUTS",
    "LENS_TOP",
    "PIECE_BYTES",
    "to_onnx",
    "to_onnx_gguf",
    "pieces",
    "tokenizer_json",
    "gguf_tokenizer_json",
    "weights_sha256",
    "chat_frame",
    "manifest",
    "export",
    "export_smollm2",
    "main",
]
