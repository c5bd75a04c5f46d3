"""``manage.py serve --port 8000``: the control plane (``console.asgi:application``) on daphne.

``--fd N`` serves on an inherited listening socket instead (``manage.py up --replicas``: the
kernel hands each new connection to one of the replicas accepting on it).

``--endpoint`` takes a daphne (Twisted) endpoint description instead of ``--host``/``--port``:
``ssl:8443:interface=198.18.0.10:privateKey=key.pem:certKey=cert.pem`` serves TLS itself
(docs/node-protocol.md, "TLS").

The same server ``daphne console.asgi:application`` starts, with the websocket settings daphne's
command line cannot set: messages over ``settings.WEBSOCKET_MAX_MESSAGE_BYTES`` close the
connection with 1009 ("message too big") and a reason, instead of daphne's default of dropping
the TCP connection (which a client sees as 1006, no reason).
"""

from __future__ import annotations

from django.conf import settings

from console.lib.commands import ArrayCommand


class Command(ArrayCommand):
    help = "Serve the control plane (pages, /api/, /v1/, websockets) with daphne."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="bind address")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--fd",
            type=int,
            default=None,
            help="serve on this inherited listening socket instead of binding one (manage.py up "
            "--replicas: every replica accepts from one port)",
        )
        parser.add_argument(
            "--endpoint",
            default=None,
            help="a daphne endpoint description instead of --host/--port, e.g. "
            "ssl:8443:interface=198.18.0.10:privateKey=key.pem:certKey=cert.pem (TLS)",
        )

    def handle(self, *args, **options) -> None:
        from daphne.endpoints import build_endpoint_description_strings
        from daphne.server import Server
        from twisted.internet import reactor

        from console.asgi import application

        server = Server(
            application=application,
            endpoints=[options["endpoint"]]
            if options["endpoint"]
            else build_endpoint_description_strings(
                host=None if options["fd"] is not None else options["host"],
                port=None if options["fd"] is not None else options["port"],
                file_descriptor=options["fd"],
            ),
            websocket_max_message_size=settings.WEBSOCKET_MAX_MESSAGE_BYTES,
            verbosity=0,
            action_logger=None,
        )

        def close_oversized_with_1009() -> None:
            # the factory exists once the reactor runs; its options reach each connection
            server.ws_factory.setProtocolOptions(failByDrop=False)

        reactor.callWhenRunning(close_oversized_with_1009)
        where = options["endpoint"] or f"http://{options['host']}:{options['port']}/"
        self.stdout.write(f"control plane on {where}")
        self.stdout.flush()
        server.run()
