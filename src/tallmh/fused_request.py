"""Where the set-up's Newton passes find a request to make the exact test's table weights in the pass
(:mod:`tallmh.fused_table`), registered for the data while the set-up runs. No imports of tallmh: the passes
(:mod:`tallmh.setup_passes`) ask it without importing the table's code."""

from __future__ import annotations

import threading

_REQUESTS: dict = {}  # id(data) -> request, while a set-up runs on that data (registered)
_LOCK = threading.Lock()


class _NoRequest:
    def saw(self, h):
        pass

    def ready(self, pending):
        return False

    def one_pass_scale(self, d, n, m):
        return None

    def mean_for(self, center):
        return None

    def prescreen(self, *args):
        pass


_NONE = _NoRequest()


def request_of(data):
    """The request registered for ``data`` (None or none registered: a do-nothing stand-in)."""
    req = _REQUESTS.get(id(data)) if data is not None else None
    return req if req is not None and req.data is data else _NONE


class registered:
    """``with registered(data, req):`` registers ``req`` (not None) for ``data``; yields ``req``."""

    def __init__(self, data, req):
        self.data, self.req = data, req

    def __enter__(self):
        if self.req is not None:
            with _LOCK:
                _REQUESTS[id(self.data)] = self.req
        return self.req

    def __exit__(self, *exc):
        if self.req is not None:
            with _LOCK:
                _REQUESTS.pop(id(self.data), None)
        return False
