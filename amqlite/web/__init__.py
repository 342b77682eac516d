"""Static files of the management page, served by :mod:`amqlite.server.http`.

``index.html``, ``app.js`` (one ES module, no build step, no library) and
``style.css``; the page talks only to the management API (docs/http.md).
"""

from pathlib import Path

__all__ = ["STATIC_DIR"]

#: where the page's files are (package data)
STATIC_DIR = Path(__file__).resolve().parent
