"""The local cloud process: moto's server with spotrain's extensions, over HTTPS on a loopback
port.

Run by `spotrain local up` as `python -m spotrain.localcloud.server --port N --cert C --key K`;
it serves until it receives SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cheroot import wsgi
from cheroot.ssl.builtin import BuiltinSSLAdapter

from spotrain.localcloud import extensions, faults, price_list, retries, schedules

KEEP_ALIVE_S = 300
"""How long an idle connection stays open, and how long a started request may take to arrive:
longer than any client keeps an idle connection (Terraform's AWS SDK: 90 s), so a client never
reuses one the cloud has just closed."""

IDLE_CONNECTIONS = 2000
"""Idle connections kept open at once (every boto3 client keeps up to ten)."""

WORKER_THREADS = 64
"""Requests served at once: a request may wait on another (a stream's function calls the cloud
back while the write that fed it is still being answered)."""


def serve(host: str, port: int, cert: str, key: str) -> None:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

    # Functions the cloud runs (stream mappings) call it back at this address.
    os.environ[extensions.ENDPOINT_VARIABLE] = f"https://{host}:{port}"
    os.environ[extensions.CA_BUNDLE_VARIABLE] = str(Path(cert).parent / "ca.pem")
    extensions.install()
    app: Any = price_list.served(DomainDispatcherApplication(create_backend_app))
    faults_file = faults.served_file()
    if faults_file is not None:
        app = faults.injected(app, faults_file)
        schedules.start(faults_file.with_name(schedules.CLOCK_NAME))
    app = logged(retries.answered_once(app))
    # Connections are kept alive (werkzeug's server closes each after one response): a request
    # on an open connection costs half the CPU of one that starts with a TLS handshake, on
    # both sides, and Terraform's provider no longer opens hundreds of connections an apply.
    server = wsgi.Server((host, port), app, numthreads=WORKER_THREADS, timeout=KEEP_ALIVE_S,
                         server_name="spotrain-local-cloud")  # fmt: skip
    server.keep_alive_conn_limit = IDLE_CONNECTIONS
    server.ssl_adapter = HandshakeInItsOwnThread(cert, key)
    server.prepare()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(f"local cloud serving on https://{host}:{port}", flush=True)
    stop.wait()
    server.stop()
    sys.stdout.flush()


def logged(app: Callable[..., Any]) -> Callable[..., Any]:
    """WSGI middleware: a line on the cloud's log (server.log) for each request answered, with
    the attempt when the client retried and whether the first attempt's reply was replayed,
    written out each second rather than each line (a write a request slowed every request)."""

    def middleware(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        def start(status: str, headers: list[tuple[str, str]], *exc_info: Any) -> Any:
            query = environ.get("QUERY_STRING")
            target = environ.get("PATH_INFO", "") + (f"?{query}" if query else "")
            attempt = retries.attempt_of(environ)
            retried = f" attempt {attempt}" if attempt > 1 else ""
            replayed = " replayed" if environ.get("spotrain.replayed") else ""
            code = status.split(" ", 1)[0]
            sys.stdout.write(f"{time.strftime('%H:%M:%S')} {environ.get('REQUEST_METHOD')} "
                             f"{target} {code}{retried}{replayed}\n")  # fmt: skip
            return start_response(status, headers, *exc_info)

        return app(environ, start)

    def flush_each_second() -> None:
        while True:
            time.sleep(1)
            sys.stdout.flush()

    threading.Thread(target=flush_each_second, daemon=True).start()
    return middleware


class HandshakeInItsOwnThread(BuiltinSSLAdapter):  # type: ignore[misc]
    """TLS is negotiated in each connection's worker thread, at its first read, not in the
    accept loop (the adapter's default): there one stalled handshake, a client starved of CPU
    in a full test run, held up every connection behind it, and clients that gave up retried
    requests the cloud had already done (a create answered "already exists")."""

    def wrap(self, sock: Any) -> tuple[Any, dict[str, str]]:
        wrapped = self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return wrapped, {"wsgi.url_scheme": "https", "HTTPS": "on"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to listen on")
    parser.add_argument("--port", type=int, required=True, help="port to listen on")
    parser.add_argument("--cert", required=True, help="server certificate (PEM)")
    parser.add_argument("--key", required=True, help="server private key (PEM)")
    args = parser.parse_args()
    if not args.host.startswith("127.") and args.host != "localhost":
        parser.error("the local cloud listens on loopback only: use --host 127.0.0.1")
    serve(args.host, args.port, args.cert, args.key)


if __name__ == "__main__":
    main()
