"""The common base of the book's widgets: anywidget with all data in synced traits.

Everything a view needs lives in the widget state, so the same widget works in Jupyter, in Colab
and in the static HTML book, where no Python kernel runs. Reprs and state are deterministic, so a
notebook's stored outputs do not change between runs (strict nbval).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import anywidget

_HERE = Path(__file__).parent


def read_asset(name: str) -> str:
    """The text of a JS or CSS file shipped next to this module."""
    return (_HERE / name).read_text(encoding="utf-8")


def esm(*names: str) -> str:
    """One ES module made of several files shipped next to this module, in order: shared parts
    first (``dom.js``, ``heads.js``, ``distribution.js``: named exports only), the view last (its
    ``export default``). The page loads a widget's module from its state as one text, so a view
    cannot import a sibling file; joining them keeps one copy of each part.

    >>> esm("dom.js").count("export default"), esm("dom.js", "attention.js").count("export default")
    (0, 1)
    """
    return "\n".join(read_asset(n) for n in names)


def check_strings(name: str, value: Any) -> list[str]:
    """``value`` as a list of strings (each item passed through ``str``); a ``str`` itself is
    refused, since it would be split into its characters.

    >>> check_strings("tokens", ["a", 1])
    ['a', '1']
    >>> check_strings("tokens", "ab")
    Traceback (most recent call last):
    ...
    ValueError: tokens must be a list of strings, got a str
    """
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ValueError(f"{name} must be a list of strings, got a {type(value).__name__}")
    return [str(v) for v in value]


def check_title(title: Any) -> str:
    """A widget's title: a ``str`` (traitlets would raise its own TraitError)."""
    if not isinstance(title, str):
        raise ValueError(f"title must be a str, got {title!r}")
    return title


def rounded(x: Any, ndigits: int = 6) -> Any:
    """Nested lists of floats rounded, for a compact and deterministic widget state.

    >>> rounded([[0.1234567, 1], [2.0]], 3)
    [[0.123, 1.0], [2.0]]
    """
    if hasattr(x, "tolist"):
        x = x.tolist()
    if isinstance(x, (list, tuple)):
        return [rounded(v, ndigits) for v in x]
    return round(float(x), ndigits)


class BookWidget(anywidget.AnyWidget):
    """Base class: a repr made of a few stable facts instead of ids and full trait dumps."""

    def _repr_facts(self) -> dict[str, Any]:  # pragma: no cover - overridden
        return {}

    def __repr__(self) -> str:
        facts = ", ".join(f"{k}={v!r}" for k, v in self._repr_facts().items())
        return f"{type(self).__name__}({facts})"
