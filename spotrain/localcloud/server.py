"""The local cloud process: moto's server with spotrain's extensions, over HTTPS on a loopback
port.

Run by `spotrain local up` as `python -m spotrain.localcloud.server --port N --cert C --key K`;
it serves until it receives SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from pathlib import Path
from typing import Any

from spotrain.localcloud import extensions, faults, price_list, schedules


def serve(host: str, port: int, cert: str, key: str) -> None:
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import load_ssl_context, make_server

    # Functions the cloud runs (stream mappings) call it back at this address.
    os.environ[extensions.ENDPOINT_VARIABLE] = f"https://{host}:{port}"
    os.environ[extensions.CA_BUNDLE_VARIABLE] = str(Path(cert).parent / "ca.pem")
    extensions.install()
    app: Any = price_list.served(DomainDispatcherApplication(create_backend_app))
    faults_file = faults.served_file()
    if faults_file is not None:
        app = faults.injected(app, faults_file)
        schedules.start(faults_file.with_name(schedules.CLOCK_NAME))
    server = make_server(host, port, app, threaded=True, request_handler=MotoRequestHandler)
    # TLS is negotiated in each connection's own thread, at its first read, not in the accept
    # loop (werkzeug's default): there one stalled handshake, a client starved of CPU in a
    # full test run, held up every connection behind it, and clients that gave up retried
    # requests the cloud had already done (a create answered "already exists").
    context = load_ssl_context(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True,
                                        do_handshake_on_connect=False)  # fmt: skip
    server.ssl_context = context
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(f"local cloud serving on https://{host}:{port}", flush=True)
    stop.wait()
    server.shutdown()


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
