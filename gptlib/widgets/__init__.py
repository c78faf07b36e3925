"""Interactive figures of the book, built on anywidget with all data in the widget state.

They work in Jupyter, in Colab (custom widget manager enabled) and in the static HTML book. The
playground also runs the book's model: in the page (onnxruntime-web) or in the kernel (PyTorch).
"""

from .attention import AttentionView
from .bpe import BPEMergeView
from .playground import PlaygroundView
from .sampling import SamplingView

__all__ = ["BPEMergeView", "AttentionView", "SamplingView", "PlaygroundView"]
