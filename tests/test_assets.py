"""gptlib.assets: the registry files the book fetches, described and checked by their sha256."""

import hashlib

import pytest

from gptlib import assets
from gptlib.assets import ASSETS, Asset, asset_path, sha256_file


def _asset(**changes) -> Asset:
    fields = dict(
        filename="f.bin",
        registry="pypi",
        package="x==1.0",
        archive="sdist",
        member="f.bin",
        sha256="0" * 64,
        licence="MIT",
        about="a test file",
    )
    return Asset(**{**fields, **changes})


def test_the_book_assets_are_well_formed():
    assert sorted(ASSETS) == ["brown", "gpt2-ranks", "smollm2-gguf"]
    for name, a in ASSETS.items():
        assert a.sha256 == a.sha256.lower() and len(a.sha256) == 64, name


def test_an_asset_digest_must_be_64_lowercase_hex_digits():
    """A digest that sha256_file can never return (not hex, or in capitals) would make every fetch
    fail after the download; it is refused when the asset is described."""
    for bad in ("z" * 64, "A" * 64, "0" * 63, " " + "0" * 63, 64):
        with pytest.raises(ValueError, match="sha256"):
            _asset(sha256=bad)
    with pytest.raises(ValueError, match="registry/archive"):
        _asset(registry="conda")


def test_asset_names_are_checked_before_anything_is_read(tmp_path, monkeypatch):
    monkeypatch.setenv("GPTLIB_CACHE_DIR", str(tmp_path))
    for bad in (["gpt2-ranks"], None, 3, "gpt2"):
        with pytest.raises(ValueError, match="name must be one of"):
            asset_path(bad)
        with pytest.raises(ValueError, match="name must be one of"):
            assets.fetch(bad)
    with pytest.raises(ValueError, match="force must be True or False"):
        assets.fetch("gpt2-ranks", force="yes")
    with pytest.raises(FileNotFoundError, match="fetch gpt2-ranks"):
        asset_path("gpt2-ranks")


def test_asset_path_refuses_a_file_with_another_digest(tmp_path, monkeypatch):
    monkeypatch.setenv("GPTLIB_CACHE_DIR", str(tmp_path))
    (tmp_path / ASSETS["gpt2-ranks"].filename).write_bytes(b"not the ranks")
    with pytest.raises(ValueError, match="has sha256 .* expected"):
        asset_path("gpt2-ranks")
    assert (
        sha256_file(tmp_path / ASSETS["gpt2-ranks"].filename)
        == hashlib.sha256(b"not the ranks").hexdigest()
    )
