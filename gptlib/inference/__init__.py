"""Chapter 13: inference, exactly — one module per concept.

flash.py        the online softmax and FlashAttention's tiling (equal to attention; memory
                traffic counted as a function of the on-chip size M)
speculative.py  speculative sampling: the acceptance rule, its exact emitted distribution,
                speculative decoding with a KV cache, the expected tokens per target pass
quantize.py     absmax int8 per row and blockwise b-bit with a scale and a minimum (GGUF's
                Q4_1 at b = 4): the maps, their error bounds and the uniform-noise model
"""

from . import flash, quantize, speculative
from .flash import *  # noqa: F403
from .quantize import *  # noqa: F403
from .speculative import *  # noqa: F403

__all__ = [*flash.__all__, *speculative.__all__, *quantize.__all__]
