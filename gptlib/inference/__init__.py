"""Chapter 13: inference, exactly — one module per concept.

flash.py        the online softmax and FlashAttention's tiling (equal to attention; memory
                traffic counted as a function of the on-chip size M)
speculative.py  speculative sampling: the acceptance rule, one round, its exact emitted
                distribution, the expected tokens per target pass, the chi-square's power
decoding.py     speculative decoding of a whole text with the two models' KV caches, the
                bigram draft
quantize.py     absmax int8 per row and blockwise b-bit with a scale and a minimum (GGUF's
                Q4_1 at b = 4): the maps, their error bounds and the uniform-noise model
"""

from . import decoding, flash, quantize, speculative
from .decoding import *  # noqa: F403
from .flash import *  # noqa: F403
from .quantize import *  # noqa: F403
from .speculative import *  # noqa: F403

__all__ = [*flash.__all__, *speculative.__all__, *decoding.__all__, *quantize.__all__]
