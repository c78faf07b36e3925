"""Chapter 1's BPE merge explorer: a slider over merge steps, the sentence split at each step."""

from __future__ import annotations

import traitlets

from ..tokenizers.base import text_bytes
from ._base import BookWidget, bundle, check_strings, check_title, read_asset


class BPEMergeView(BookWidget):
    """Show how a sentence is split as BPE merges apply, one merge per slider step.

    steps[i] is the list of pieces after i merges (steps[0]: bytes or characters); merges[i] is a
    label for merge i + 1, e.g. ``"'t' + 'h' -> 'th'"``. Hence ``len(steps) == len(merges) + 1``.
    The view opens on the last step; the pieces the shown merge created are outlined.

    >>> merges = ["'t' + 'h' -> 'th'", "'th' + 'e' -> 'the'"]
    >>> BPEMergeView([list("the"), ["th", "e"], ["the"]], merges)
    BPEMergeView(merges=2, pieces=[3, 1])
    """

    _esm = bundle("bpe")
    _css = read_asset("widgets.css")
    steps = traitlets.List(traitlets.List(traitlets.Unicode())).tag(sync=True)
    merges = traitlets.List(traitlets.Unicode()).tag(sync=True)
    title = traitlets.Unicode("").tag(sync=True)
    step = traitlets.Int(0).tag(sync=True)

    def __init__(self, steps: list[list[str]], merges: list[str], title: str = ""):
        if isinstance(steps, (str, bytes)):
            raise ValueError("steps must be a list of splits (lists of strings), got a str")
        steps = [check_strings(f"steps[{i}]", s) for i, s in enumerate(steps)]
        merges = check_strings("merges", merges)
        check_title(title)
        if not steps:
            raise ValueError("steps must hold at least the unmerged split (steps[0])")
        if any("" in s for s in steps):
            raise ValueError("steps must not hold an empty piece: no token is empty")
        if not steps[0]:
            raise ValueError("steps[0] holds no text: there is nothing to merge")
        if len(steps) != len(merges) + 1:
            raise ValueError(
                f"steps must have len(merges) + 1 = {len(merges) + 1} entries, got {len(steps)}"
            )
        # (a piece may be a byte outside a whole character, written <0xNN>: compare the bytes)
        joined = {text_bytes("".join(s)) for s in steps}
        if len(joined) != 1:
            raise ValueError("steps must all concatenate to the same text")
        super().__init__(steps=steps, merges=merges, title=title, step=len(merges))

    def _repr_facts(self):
        return {
            "merges": len(self.merges),
            "pieces": [len(s) for s in (self.steps[0], self.steps[-1])],
        }
