"""What a reader trips on at 420 px and in dark mode, measured in the built book (`make book`).

Display maths scrolls sideways in its own box and its number never covers it; an inline formula
stays within the column or scrolls in its own box (:data:`MATHS`); the attention widget's colour
scale starts at the page's background, its heatmap fits the column or says it scrolls, and its key
labels tell the tokens apart (:func:`attention_at_420`, :func:`check_attention_at_420`). The light
theme's pages at 420 px are those test_browser_reading.py loads once for every page and narrows to
420 px: it runs both checks there (the maths on every page), so that Chapters 4 and 7 are not
loaded again for them. Here: Chapter 4 in the dark theme, set before its scripts run.
"""

from __future__ import annotations

import contextlib
import json

import pytest
from browser_support import HTML, open_page
from playwright.sync_api import TimeoutError as PlaywrightTimeout

browser_test = pytest.mark.browser

# Every display formula: its visible part (clipped to its scrolling box) must not meet its number,
# and a formula wider than its box must be able to scroll. Inline formulas that run past the
# column's right edge must be marked to scroll (book_static/maths.js) and scroll, unless they sit
# in a table, whose own box scrolls sideways (the theme's .pst-scrollable-table-container).
MATHS = """() => {
  const col = document.querySelector('article.bd-article').getBoundingClientRect();
  const bad = [];
  for (const d of document.querySelectorAll('article.bd-article div.math')) {
    const box = d.querySelector('mjx-container'), num = d.querySelector('span.eqno');
    if (!box) continue;
    const b = box.getBoundingClientRect();
    const f = (box.querySelector('mjx-math') || box).getBoundingClientRect();
    const left = Math.max(b.left, f.left), right = Math.min(b.right, f.right);
    if (num) {
      const n = num.getBoundingClientRect();
      const across = Math.min(n.right, right) - Math.max(n.left, left);
      const down = Math.min(n.bottom, f.bottom) - Math.max(n.top, f.top);
      if (across > 0 && down > 0) bad.push(`${num.textContent} covers its formula`);
    }
    const scrolls = getComputedStyle(box).overflowX === 'auto' && box.scrollWidth > box.clientWidth;
    if (f.width > b.width + 1 && !scrolls)
      bad.push(`${d.id} is clipped with no way to scroll`);
    if (b.right > col.right + 1) bad.push(`${d.id} runs past the column`);
  }
  const inline = 'article.bd-article mjx-container:not([display="true"])';
  for (const m of document.querySelectorAll(inline)) {
    const r = m.getBoundingClientRect();
    // (a table scrolls sideways in its own box, with the formulas in it)
    if (r.width === 0 || m.closest('aside, .margin, .sidebar, .pst-scrollable-table-container'))
      continue;
    if (r.right > col.right + 1 && !m.classList.contains('gptlib-wide-math'))
      bad.push(`inline ${m.textContent.slice(0, 40)} runs past the column`);
  }
  const wide = [...document.querySelectorAll('.gptlib-wide-math')]
    .filter((m) => m.scrollWidth > m.clientWidth).length;
  return { bad, wide };
}"""


def _open(context, site, chapter, width, theme="light"):
    if not (HTML / "chapters" / f"{chapter}.html").is_file():
        pytest.skip(f"chapter {chapter} is not in the built book")
    page = context.new_page()
    page.set_viewport_size({"width": width, "height": 900})
    page.add_init_script(
        f"localStorage.setItem('theme', '{theme}'); localStorage.setItem('mode', '{theme}');"
    )
    open_page(page, f"{site}/chapters/{chapter}.html")
    # open_page waited for maths.js's first marking of the wide inline formulas (each chapter
    # tested here has one at 420 px): wait for the mark itself, not a fixed time (without one,
    # the test says so below)
    with contextlib.suppress(PlaywrightTimeout):
        page.wait_for_function(
            "() => document.querySelector('.gptlib-wide-math') !== null", timeout=5_000
        )
    return page


@pytest.fixture(scope="module")
def opened(browser, site):
    """``opened(chapter, width, theme="light")``: the chapter's page at that window width and
    theme, typeset and its wide formulas marked, loaded once for the module (the tests only read
    it). The pages are tabs of one browser context, with the widgets' test hook on (as conftest's
    ``browser.new_page``), so that the scripts every page loads (the theme's, the widget manager)
    come from its caches; each tab sets its theme before its scripts run."""
    pages = {}
    context = browser.new_context()
    context.add_init_script("window.__gptlibTest = true;")

    def get(chapter, width, theme="light"):
        if (chapter, width, theme) not in pages:
            pages[chapter, width, theme] = _open(context, site, chapter, width, theme)
        return pages[chapter, width, theme]

    try:
        yield get
    finally:
        for page in pages.values():
            page.close()
        context.close()


def _frames(page, n: int = 2) -> None:
    """Wait for ``n`` animation frames: what a view checks after drawing (its ResizeObserver, a
    requestAnimationFrame) has run."""
    page.evaluate(
        "(n) => new Promise((done) => { const f = (k) => k ? requestAnimationFrame(() => f(k - 1))"
        " : done(); f(n); })",
        n,
    )


def _luminance(rgb):
    lin = [
        (c / 255 / 12.92 if c / 255 <= 0.04045 else ((c / 255 + 0.055) / 1.055) ** 2.4) for c in rgb
    ]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def _contrast(a, b):
    hi, lo = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def attention_at_420(page) -> dict:
    """What Chapter 4's attention view shows in ``page`` (the chapter at 420 px): the theme, the
    background behind the view, its colour scale, its scrolling boxes and its key labels."""
    root = page.locator(".gptlib-attn").first
    root.scroll_into_view_if_needed()
    root.wait_for(timeout=20_000)
    _frames(page)  # the heatmap's scroll cue is set once the box is laid out
    return page.evaluate(
        """(root) => {
          const bg = (e) => { for (; e; e = e.parentElement) { const m = getComputedStyle(e)
            .backgroundColor.match(/[\\d.]+/g); if (m && (m.length < 4 || +m[3] > 0.5))
            return m.slice(0, 3).map(Number); } return [255, 255, 255]; };
          const col = document.querySelector('article.bd-article').getBoundingClientRect();
          const boxes = [...root.querySelectorAll('.gptlib-scroll')].map((b) => {
            const r = b.getBoundingClientRect(), cue = b.nextElementSibling;
            return { fits: r.right <= col.right + 1, scrolls: b.scrollWidth > b.clientWidth + 1,
                     cue: cue && cue.classList.contains('gptlib-scroll-cue')
                          && cue.style.display !== 'none' };
          });
          const keys = [...root.querySelectorAll('.gptlib-attn-key')];
          return { theme: document.documentElement.dataset.theme, bg: bg(root),
                   scale: JSON.parse(root.dataset.scale), boxes,
                   labels: keys.map((k) => k.textContent), titles: keys.map((k) => k.title),
                   words: [...root.querySelectorAll('.gptlib-attn-tok')]
                     .map((w) => w.textContent) };
        }""",
        root.element_handle(),
    )


def check_attention_at_420(got: dict, theme: str) -> None:
    """Chapter 4's attention view (:func:`attention_at_420`): weight 0 is the page's background
    and weight 1 stands out from it (contrast >= 3) in the ``theme``; the heatmap's box fits the
    column and says when it scrolls; each key label names its token in full, with its position in
    the hover text."""
    assert got["theme"] == theme
    scale = got["scale"]
    assert scale[0] == got["bg"], "weight 0 is the page's background"
    assert _contrast(scale[-1], got["bg"]) >= 3, json.dumps(scale)
    assert (_luminance(got["bg"]) < 0.2) == (theme == "dark")
    assert all(b["fits"] for b in got["boxes"]), got["boxes"]
    assert all(b["cue"] == b["scrolls"] for b in got["boxes"]), got["boxes"]
    words = [w.strip() for w in got["words"]]
    assert got["labels"] == words, "every key labelled by its whole token"
    assert all(t.startswith(f"key {j} ") and words[j] in t for j, t in enumerate(got["titles"]))


@browser_test
def test_attention_widget_at_420_px_follows_the_dark_theme(opened):
    """Chapter 4's attention view in the dark theme, at 420 px (in the light theme:
    test_browser_reading.py, on its load of the chapter)."""
    check_attention_at_420(attention_at_420(opened("04_attention", 420, "dark")), "dark")
