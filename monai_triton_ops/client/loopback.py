"""The few HTTP calls the local server's launcher makes to its own server, with ``urllib`` and a timeout on each.

Plain HTTP on loopback only, and stdlib only: the launcher polls a server that is starting up, many times a
second, from any thread, and needs neither TLS nor credentials nor the transports' gevent clients.

Proxies from the environment are ignored: the server is on loopback, and a proxy would only add a way to
fail. Every call answers ``None``/``False`` on a connection error instead of raising, because during
start-up "not yet" is the normal answer; the caller owns the deadline.
"""

from __future__ import annotations

import http.client
import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

logger = logging.getLogger(__name__)

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _request(url: str, *, method: str, data: bytes | None = None) -> urllib.request.Request:
    if not url.startswith("http://"):
        raise ValueError(f"only http:// URLs are probed, got {url!r}")
    return urllib.request.Request(url, method=method, data=data, headers={"Content-Type": "application/json"})  # noqa: S310 - http only, checked above


def http_status(url: str, *, timeout_s: float, method: str = "GET") -> int | None:
    """The HTTP status of ``url``, or ``None`` when nothing answers in time."""
    request = _request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with _opener.open(request, timeout=timeout_s) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, http.client.HTTPException, OSError):  # refused, reset, timed out, cut short
        return None


def is_ready(base_url: str, *, timeout_s: float) -> bool:
    """``/v2/health/ready``: live, and (strict readiness) every loaded model ready."""
    return http_status(f"{base_url}/v2/health/ready", timeout_s=timeout_s) == 200


def is_live(base_url: str, *, timeout_s: float) -> bool:
    return http_status(f"{base_url}/v2/health/live", timeout_s=timeout_s) == 200


def model_is_ready(base_url: str, model: str, *, timeout_s: float) -> bool:
    return http_status(f"{base_url}/v2/models/{urllib.parse.quote(model, safe='')}/ready", timeout_s=timeout_s) == 200


def repository_index(base_url: str, *, timeout_s: float) -> list[dict[str, Any]] | None:
    """``POST /v2/repository/index``: ``[{"name", "version", "state", "reason"}, ...]``, or ``None``."""
    request = _request(f"{base_url}/v2/repository/index", method="POST", data=b"{}")
    try:
        with _opener.open(request, timeout=timeout_s) as response:
            index = json.loads(response.read() or b"[]")
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        logger.debug("repository index not available: %s", exc)
        return None
    return index if isinstance(index, list) else None
