"""gptlib: the code of the book "GPT, from the mathematical viewpoint", one module per chapter.

Chapter 1 ``tokenizers`` (with the corpora in ``data``), 2 ``embedding``/``positional``, 3 ``mlp``,
4 ``attention``, 5 ``block`` (shaped by ``config``), 6 ``model``, 7 ``sampling``, 8 ``training``,
``trainer`` and ``circuits``, 9 ``rlhf`` (a package: ``objectives``, ``loops``, ``toy_task``),
10 ``parallel`` (a package: ``data``, ``tensor``, ``pipeline``, ``context``) and ``flops``,
11 ``efficiency``, ``moe``, ``scaling`` (and ``parallel.sharding``, ``parallel.experts``),
12 ``modern`` and ``gguf``, 14 ``lora`` and ``mla``. The widgets are in ``widgets``. Infrastructure
the chapters share:
``runtime``, ``hooks``, ``assets``, ``state`` and ``files`` (the one file format), ``hf``,
``recipes``, ``timing``, ``export``, ``figures``, ``parallel.launch``.
"""

from .runtime import atomic_write, autocast, autocast_dtype, device, seed_everything

__version__ = "0.1.0"

__all__ = ["device", "autocast", "autocast_dtype", "seed_everything", "atomic_write", "__version__"]
