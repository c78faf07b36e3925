"""gptlib: the code of the book "GPT, from the mathematical viewpoint", one module per chapter.

Chapter 1 ``tokenizers``, 2 ``embedding``/``positional``, 3 ``mlp``, 4 ``attention``,
5 ``block``, 6 ``model``, 7 ``sampling``, 8 ``training``, 9 ``rlhf``, 10 ``parallel`` (a package:
``data``, ``tensor``, ``pipeline``, ``context``) and ``flops``. Infrastructure the chapters share:
``runtime``, ``hooks``, ``assets``, ``checkpoint``, ``parallel.launch``.
"""

from .runtime import atomic_write, autocast, autocast_dtype, device, seed_everything

__version__ = "0.1.0"

__all__ = ["device", "autocast", "autocast_dtype", "seed_everything", "atomic_write", "__version__"]
