"""Interactive figures of the book, built on anywidget with all data in the widget state.

They work in Jupyter, in Colab (custom widget manager enabled) and in the static HTML book.
"""

from .attention import AttentionView
from .bpe import BPEMergeView
from .sampling import SamplingView

__all__ = ["BPEMergeView", "AttentionView", "SamplingView"]
