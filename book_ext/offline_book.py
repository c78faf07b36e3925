"""A Sphinx extension that keeps CDN addresses out of the book's pages.

Jupyter Book 1 always loads sphinx-thebe, which writes the address of its JavaScript bundle on a
CDN into every page. The book launches code in Colab instead, so the thebe scripts are dropped.
"""

from __future__ import annotations

CDN_HOSTS = ("unpkg.com", "cdn.jsdelivr.net", "cdnjs.cloudflare.com")


def _is_cdn(script) -> bool:
    filename = getattr(script, "filename", "") or ""
    body = getattr(script, "attributes", {}).get("body", "")
    text = f"{filename} {body}"
    return (
        "thebe" in text.lower() and any(h in text for h in CDN_HOSTS)
    ) or "sphinx-thebe.js" in text


def drop_cdn_scripts(app, pagename, templatename, context, doctree):
    if "script_files" in context:
        context["script_files"] = [s for s in context["script_files"] if not _is_cdn(s)]


def setup(app):
    app.connect("html-page-context", drop_cdn_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
