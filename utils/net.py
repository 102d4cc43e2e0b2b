"""One bounded connection probe for the services a run may talk to (the Hugging Face Hub, a W&B server).

``connection_problem(url)`` opens a TCP connection to the URL's host and port (or to the proxy in front of
it, when the environment names one) within ``timeout`` seconds, DNS resolution included, and returns None
when it opens, else one short reason ("connection refused", "no answer within 3 s", ...). A refused
connection or an unknown host is known at once, so a caller can go offline or stop without the libraries'
own retries (the hub's minutes, W&B's init timeout).
"""

from __future__ import annotations

import socket
import threading
import urllib.request
from urllib.parse import urlparse


def _endpoint(url: str) -> tuple[str | None, int]:
    """The host and port a connection to ``url`` goes to: the proxy's, when one applies."""
    parsed = urlparse(url)
    host, port = parsed.hostname, parsed.port or (443 if parsed.scheme == "https" else 80)
    proxy = urllib.request.getproxies().get(parsed.scheme)
    if proxy and host and not urllib.request.proxy_bypass(host):
        proxy_url = urlparse(proxy if "://" in proxy else f"http://{proxy}")
        host, port = proxy_url.hostname, proxy_url.port or 80
    return host, port


def connection_problem(url: str, timeout: float = 3.0) -> str | None:
    """None if a TCP connection to ``url``'s server (or its proxy) opens within ``timeout`` seconds,
    else why not, in a few words."""
    host, port = _endpoint(url)
    if not host:
        return f"{url!r} names no host"
    result: list[str | None] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            result.append(None)
        except ConnectionRefusedError:
            result.append(f"connection to {host}:{port} refused")
        except socket.gaierror:
            result.append(f"host {host} not found")
        except TimeoutError:
            result.append(f"no answer from {host}:{port} within {timeout:g} s")
        except OSError as e:
            result.append(f"{host}:{port}: {e.strerror or e}")

    # A thread bounds DNS resolution too, which the socket timeout does not cover.
    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout + 0.5)
    return result[0] if result else f"no answer from {host}:{port} within {timeout:g} s"
