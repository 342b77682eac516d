"""The browser channels' sans-IO half (docs/browser.md): JSON frames of the native
protocol's methods (:mod:`.codec`) and the bounded, numbered outbox of a browser
session (:mod:`.outbox`). The shells are in :mod:`amqlite.server.http.channels`
and :mod:`amqlite.server.endpoints.browser`."""

from .codec import FrameError, decode_request, deliver_frame, encode, notice, parse
from .outbox import Outbox

__all__ = ["FrameError", "Outbox", "decode_request", "deliver_frame", "encode", "notice", "parse"]
