"""Shared test set-up: a header saying what the run can use (torch, CUDA, Chromium, a built book),
the fixtures several test files use (one torch thread, tiny seeded models, the book's BPE), the
browser tests' fixtures (the built book served locally, one headless Chromium), and a place where a
test leaves a table for the end of the test log."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from browser_support import CHROMIUM, CHROMIUM_ARGS, HTML, serve

_SUMMARIES = pytest.StashKey[list]()


def pytest_report_header(config):
    import torch

    return [
        f"gptlib book: torch {torch.__version__}, CUDA "
        f"{'available' if torch.cuda.is_available() else 'not available'}",
        f"browser test: {CHROMIUM} {'present' if Path(CHROMIUM).exists() else 'missing'}, "
        f"built book {HTML} "
        f"{'present' if (HTML / 'index.html').is_file() else 'missing (run `make book`)'}",
    ]


# --- the order of the unit stage ----------------------------------------------------------

# The scopes that take longest (torch.onnx exports, a simulated Colab, the fuzzed tokenizers),
# longest first, measured with ``--durations``. ``make test`` runs the unit stage with
# ``--dist loadscope --no-loadscope-reorder``, so the scopes go to the two workers in the order
# collected here: the long ones first, side by side, and the many short ones after them fill
# whichever worker is free, instead of a long scope starting last while the other worker idles.
LONG_FIRST = (
    "tests/test_export.py::TestTheTinyGPTGraph",  # a two-layer GPT exported twice
    "tests/test_colab_setup.py",  # a simulated Colab: a venv, pip from the wheelhouse, a clone
    # third, so on the GPT's worker, which takes a second scope at once: a process's first
    # torch.onnx export pays for torch.export's warm-up (seconds), its second does not
    "tests/test_export.py::TestTheTinyGGUF",
    "tests/test_tokenizers_fuzz.py",
    "tests/test_parallel.py",
    "tests/test_parallel_scale.py",
    "tests/test_gguf.py",
    "tests/test_inference.py",
    "tests/test_widgets.py",
    "tests/test_model.py",
    "tests/test_data.py",  # the English model's held-out loss, recomputed
    "tests/test_rlhf.py",
    # the browser stage (``make browser``, ``--dist loadfile --no-loadscope-reorder``): its files,
    # longest first, so that the last to start is short
    "tests/test_export.py",  # the live models' files (in the unit stage: its short tests)
    "tests/test_browser_reading.py",
    "tests/test_browser.py",
    "tests/test_browser_smollm2.py",
    "tests/test_browser_live.py",
    "tests/test_browser_ux.py",
)


def pytest_collection_modifyitems(config, items):
    """The scopes of :data:`LONG_FIRST` first, in its order; the rest as collected."""

    def rank(item):
        # the longest entry that holds the item: a class before its module
        holders = [s for s in LONG_FIRST if item.nodeid.split("[")[0].startswith(s + "::")]
        return LONG_FIRST.index(max(holders, key=len)) if holders else len(LONG_FIRST)

    items.sort(key=rank)  # stable: the order within a rank is the collected one


# --- models and tokenizers -------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2-135M-Instruct from the cache (eval mode) and its tokenizer; the test skips,
    saying why, when `make smollm2` has not filled the cache."""
    from gptlib.gguf import load_smollm2

    try:
        model, tok = load_smollm2()
    except (FileNotFoundError, ValueError) as e:
        pytest.skip(f"SmolLM2 is not in the cache ({e})")
    return model.eval(), tok


@pytest.fixture
def one_thread():
    """One torch thread for the test, the count restored afterwards: tiny tensors compute as fast on
    one thread, do not spin-wait on a busy machine, and give sums that do not depend on the core
    count. A test file opts in with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def tiny_gpt():
    """``tiny_gpt(seed=0, **overrides)``: a fresh GPT of the ``"tiny"`` preset (``overrides`` go to
    ``GPTConfig.preset``), its weights drawn after ``torch.manual_seed(seed)``, in eval mode."""
    import torch

    from gptlib.model import GPT, GPTConfig

    def build(seed: int = 0, **overrides):
        torch.manual_seed(seed)
        return GPT(GPTConfig.preset("tiny", **overrides)).eval()

    return build


@pytest.fixture(scope="session")
def tiny_modern():
    """``tiny_modern(seed=0, **overrides)``: the same for the Llama-style ``ModernGPT``."""
    import torch

    from gptlib.modern import ModernConfig, ModernGPT

    def build(seed: int = 0, **overrides):
        torch.manual_seed(seed)
        return ModernGPT(ModernConfig.preset("tiny", **overrides)).eval()

    return build


@pytest.fixture(scope="session")
def book_bpe():
    """The book's 1024-token BPE (:func:`gptlib.data.book_tokenizer`): trained once per session and
    shared by every test that reads it, so no test may change it."""
    from gptlib.data import book_tokenizer

    return book_tokenizer()


@pytest.fixture(scope="session")
def gpt2():
    """GPT-2's tokenizer from its 50,257 ranks (``make test`` fetches them); skips without them."""
    from gptlib.assets import ASSETS, cache_dir
    from gptlib.tokenizers import gpt2_tokenizer

    if not (cache_dir() / ASSETS["gpt2-ranks"].filename).is_file():
        pytest.skip(
            "GPT-2 ranks not fetched: run `python -m gptlib.assets fetch gpt2-ranks` (make test "
            "does)"
        )
    return gpt2_tokenizer()


@pytest.fixture(scope="session")
def r50k(gpt2):
    """tiktoken's GPT-2 encoding, read from the same ranks file by tiktoken's own loader: the
    peer."""
    import tiktoken
    import tiktoken.load

    from gptlib.assets import asset_path
    from gptlib.tokenizers import GPT2_SPLIT_PATTERN

    ranks = tiktoken.load.load_tiktoken_bpe(str(asset_path("gpt2-ranks")))
    return tiktoken.Encoding(
        "r50k-local",
        pat_str=GPT2_SPLIT_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": 50256},
    )


@pytest.fixture(scope="session")
def english():
    """The shipped English model and its tokenizer (``models/english``), in eval mode."""
    from gptlib.model import GPT
    from gptlib.tokenizers import BPETokenizer

    path = Path(__file__).resolve().parents[1] / "models" / "english"
    if not (path / "model.safetensors").is_file():
        pytest.skip(f"no shipped model at {path}")
    return GPT.load(path).eval(), BPETokenizer.load(path / "tokenizer.json")


# --- the built book and the browser ----------------------------------------------------------

REQUIRE_BOOK = "GPTLIB_REQUIRE_BOOK"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under ``GPTLIB_REQUIRE_BOOK=1`` (``make test`` and ``make browser`` set it, after building
    the book) a test marked ``browser`` that skips fails instead, its reason kept: a missing book,
    live model or page there means the build is broken, not that the test does not apply. Run by
    hand without it, such a test still skips, saying what to build."""
    outcome = yield
    report = outcome.get_result()
    if (
        report.skipped
        and os.environ.get(REQUIRE_BOOK) == "1"
        and item.get_closest_marker("browser") is not None
        and not hasattr(report, "wasxfail")
    ):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"{REQUIRE_BOOK}=1, so a browser test may not skip: {reason}"


@pytest.fixture(scope="session")
def site():
    """The built book (``make book``), served on a local port; skips when it is missing."""
    if not (HTML / "index.html").is_file():
        pytest.skip(f"no built book at {HTML}: run `make book` first")
    with serve(HTML) as url:
        yield url


class _TestBrowser:
    """A Playwright browser whose pages set the widgets' test hook before any script runs:
    ``window.__gptlibTest = true`` makes each view report what it draws on its root (data-*
    attributes, ``root.__gptlib``; gptlib/widgets/js/dom.js, ``report``)."""

    def __init__(self, browser):
        self._browser = browser

    def new_page(self, **kwargs):
        page = self._browser.new_page(**kwargs)
        page.add_init_script("window.__gptlibTest = true;")
        return page

    def __getattr__(self, name):
        return getattr(self._browser, name)


@pytest.fixture(scope="session")
def browser():
    """Debian's Chromium, headless, driven by Playwright, with the widgets' test hook on; skips
    when Chromium is missing."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (Debian package chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield _TestBrowser(b)
        finally:
            b.close()


@pytest.fixture(scope="session")
def summary(request):
    """``summary(title, text)`` prints ``text`` at the end of the run, passed or not, even under
    -q."""
    items = request.config.stash.setdefault(_SUMMARIES, [])
    return lambda title, text: items.append((title, text))


def pytest_sessionfinish(session):
    """Under pytest-xdist, a worker hands its tables to the controller, which prints them."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["gptlib_summaries"] = [list(t) for t in session.config.stash.get(_SUMMARIES, [])]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    received = getattr(node, "workeroutput", {}).get("gptlib_summaries", [])
    node.config.stash.setdefault(_SUMMARIES, []).extend(tuple(t) for t in received)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    for title, text in config.stash.get(_SUMMARIES, []):
        terminalreporter.write_sep("-", title)
        terminalreporter.write_line(text)
