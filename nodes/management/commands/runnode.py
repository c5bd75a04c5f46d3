"""``manage.py runnode``: one node agent serving one model package over HTTP (daphne).

With ``--join <control plane URL> --join-token <token>`` a node on another host registers
itself first and keeps the credential it receives in its credential file (docs/node-protocol.md,
"Joining from another host")."""

from __future__ import annotations

import os
import ssl
import threading
from pathlib import Path

import psutil
from django.core.management.base import BaseCommand, CommandError

from console.lib import logs
from console.lib.log_shipping import ENV_LOGS_URL, ship_from_here, to_control_plane
from inference.engine.config import EngineConfig, default_host_ram_mib
from inference.engine.scheduler import Engine
from nodes.agent.app import NodeApp
from nodes.agent.auth import CredentialCheck, NoCredential
from nodes.agent.factory import chat_service_for
from nodes.agent.joining import (
    ENV_JOIN_TOKEN,
    JoinFailed,
    array_in_file,
    credential_in_file,
    join_array,
    still_registered,
    write_credential_file,
)
from nodes.agent.node_state import NodeIdentity
from nodes.agent.validation import DeviceValidation
from nodes.devices.host import host_from_environment


def parse_cpu_set(text: str) -> set[int]:
    """``"0-3,6"`` -> ``{0, 1, 2, 3, 6}``. Raises ``ValueError`` on bad syntax."""
    cpus: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    if not cpus:
        raise ValueError(f"empty CPU set {text!r}")
    return cpus


ENV_REPEATABLE = "PHALANX_REPEATABLE"


def kv_unified_for(choice: str) -> bool | None:
    """``on`` / ``off``: a unified KV buffer or one stream per sequence; ``auto``: None, the
    engine times both at load and keeps the faster (``inference.engine.tuning``)."""
    return None if choice == "auto" else choice == "on"


# The engine's llama.cpp settings a node takes as a choice: (flag, choices, default, help).
ENGINE_CHOICES = [
    (
        "--kv-unified",
        ["auto", "on", "off"],
        "auto",
        "one KV buffer for all sequences; auto: whichever decodes faster, timed at load",
    ),
    (
        "--kv-type",
        ["f16", "q8_0"],
        "f16",
        "K and V cache type; q8_0 halves the bytes (and needs flash attention)",
    ),
    (
        "--flash-attn",
        ["auto", "on", "off"],
        "auto",
        "llama.cpp's flash attention; auto: whichever decodes faster, timed at load (on with "
        "--repeatable or a quantized cache)",
    ),
    (
        "--speculate",
        ["auto", "on", "off"],
        "auto",
        "speculative decoding by prompt lookup; auto: when the step cost measured at load "
        "says it pays",
    ),
]


def _advertised(o: dict) -> str:
    """The address the control plane should reach this node at: ``--advertise``, else
    ``--listen`` unless that is a wildcard (``CommandError`` then)."""
    address = o["advertise"] or o["listen"]
    host = address.rpartition(":")[0]
    if host in ("", "0.0.0.0", "::", "[::]"):
        raise CommandError(
            f"--advertise host:port is needed: --listen {o['listen']} is not an address the "
            "control plane can reach"
        )
    return address


def join_if_asked(o: dict, say) -> None:
    """``--join``: register with the control plane using the join token and write what it
    gives to the credential file (default ``$PHALANX_HOME/node-<id>.credential``), unless the
    file holds a credential already (a restart: checked still valid). Sets ``o``'s
    ``credential_file`` and ``array_id``. Raises ``CommandError`` (refused, revoked)."""
    if not o["join"]:
        return
    from django.conf import settings

    path = Path(o["credential_file"] or Path(settings.VAR_DIR) / f"node-{o['id']}.credential")
    verify = ssl.create_default_context(cafile=o["join_ca"]) if o["join_ca"] else True
    o["credential_file"] = str(path)
    held = credential_in_file(path)
    if held:
        refused = still_registered(o["join"], node_id=o["id"], credential=held, verify=verify)
        if refused:
            raise CommandError(
                f"the control plane refuses this node's credential ({refused}): it was "
                f"revoked. Remove {path}, mint a new join token and join again"
            )
        say(f"node {o['id']}: already joined, credential in {path}")
    else:
        token = o["join_token"] or os.environ.get(ENV_JOIN_TOKEN, "")
        if not token:
            raise CommandError(f"--join needs --join-token (or ${ENV_JOIN_TOKEN})")
        try:
            joined = join_array(
                o["join"],
                token=token,
                node_id=o["id"],
                address=_advertised(o),
                package=o["package"],
                verify=verify,
            )
        except JoinFailed as exc:
            raise CommandError(str(exc)) from exc
        write_credential_file(path, joined)
        say(f"node {o['id']}: joined {o['join']}, credential in {path}")
    o["array_id"] = o["array_id"] or array_in_file(path)


def ship_node_logs(o: dict, credentials: CredentialCheck) -> None:
    """Ship this node's log records to its control plane (``console.lib.log_shipping``):
    ``--join``'s URL, else ``$PHALANX_LOGS_URL`` (``up`` sets it); with neither, the records
    go to stderr only. What cannot be sent waits in ``$PHALANX_HOME/log-spool/<id>.jsonl``."""
    from django.conf import settings

    url = o["join"] or os.environ.get(ENV_LOGS_URL, "")
    if not url:
        return
    verify = ssl.create_default_context(cafile=o["join_ca"]) if o["join_ca"] else True
    deliver = to_control_plane(
        url, node_id=o["id"], credentials=credentials.credentials, verify=verify
    )
    spool = Path(settings.VAR_DIR) / "log-spool" / f"{o['id']}.jsonl"
    ship_from_here("runnode", deliver, spool=spool)


def engine_config(o: dict) -> EngineConfig:
    """The ``EngineConfig`` for runnode's parsed options ``o``; ``CommandError`` for a
    combination llama.cpp refuses. ``--host-ram-mib`` unset: ``default_host_ram_mib``."""
    if o["kv_type"] != "f16" and o["flash_attn"] == "off":
        raise CommandError(
            f"--kv-type {o['kv_type']} needs flash attention (llama.cpp quantizes the V "
            "cache only with it): use --flash-attn auto or on"
        )
    host_ram_mib = o["host_ram_mib"]
    if host_ram_mib is None:
        host_ram_mib = default_host_ram_mib(psutil.virtual_memory().available)
    return EngineConfig(
        model_path=o["model"],
        sequences=o["sequences"],
        ctx_per_seq=o["ctx_per_seq"],
        n_batch=o["n_batch"],
        prefill_chunk=o["prefill_chunk"],
        threads=o["threads"],
        host_ram_mib=host_ram_mib,
        max_queue=o["max_queue"],
        prefix_reuse=not o["no_prefix_reuse"],
        kv_unified=kv_unified_for(o["kv_unified"]),
        kv_type=o["kv_type"],
        flash_attn=o["flash_attn"],
        repeatable=o["repeatable"],
        speculate=o["speculate"],
        prefix_dir=_default_prefix_dir() if o.get("prefix_dir") is None else o["prefix_dir"],
    )


def _default_prefix_dir() -> str:
    """``$PHALANX_PREFIX_DIR`` when set ('' keeps none), else ``$PHALANX_HOME/prefix-cache``."""
    from django.conf import settings

    return os.environ.get("PHALANX_PREFIX_DIR", str(Path(settings.VAR_DIR) / "prefix-cache"))


def add_join_arguments(parser) -> None:
    """``--join``, ``--join-token``, ``--join-ca``, ``--advertise`` (``join_if_asked``)."""
    parser.add_argument(
        "--join",
        default=None,
        metavar="URL",
        help="join the array whose control plane is at URL (http://host:port) with "
        "--join-token, then serve; the credential received goes to --credential-file",
    )
    parser.add_argument(
        "--join-token", default=None, help="a one-time join token (or $PHALANX_JOIN_TOKEN)"
    )
    parser.add_argument(
        "--join-ca",
        default=None,
        metavar="PEM",
        help="CA certificate(s) to trust for an https:// --join URL (default: the system's)",
    )
    parser.add_argument(
        "--advertise",
        default=None,
        metavar="HOST:PORT",
        help="the address the control plane reaches this node at (default: --listen)",
    )


class Command(BaseCommand):
    help = "Run a node agent: load a GGUF package into the engine and serve the node protocol."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--id", required=True, help="node id, e.g. node-01")
        parser.add_argument("--listen", default="127.0.0.1:9401", help="host:port")
        parser.add_argument("--model", required=True, help="path of the GGUF file")
        parser.add_argument("--package", default=None, help="package name clients ask for")
        parser.add_argument(
            "--sha256", default="", help="sha256 of the GGUF (stamped on exported state)"
        )
        parser.add_argument("--threads", type=int, default=1)
        parser.add_argument("--cpus", default=None, help="CPU list to pin to, e.g. 0 or 0-3")
        parser.add_argument("--sequences", type=int, default=8)
        parser.add_argument("--ctx-per-seq", type=int, default=2048)
        parser.add_argument("--n-batch", type=int, default=512)
        parser.add_argument("--prefill-chunk", type=int, default=256)
        parser.add_argument(
            "--host-ram-mib",
            type=int,
            default=None,
            help="host RAM (MiB) for idle sessions' KV; default: a quarter of the memory "
            "available at start, at least 256",
        )
        parser.add_argument("--max-queue", type=int, default=64)
        for flag, choices, default, help_text in ENGINE_CHOICES:
            parser.add_argument(flag, choices=choices, default=default, help=help_text)
        parser.add_argument(
            "--repeatable",
            action="store_true",
            default=os.environ.get(ENV_REPEATABLE, "") not in ("", "0"),
            help="the same seed gives the same text whether a prompt's prefix came from the KV "
            "cache or was prefilled: flash attention stays on and auto never drafts, at a cost "
            f"in decode speed on CPUs where it is slower (docs/engine.md; also ${ENV_REPEATABLE}=1)",
        )
        parser.add_argument(
            "--array-id",
            default=os.environ.get("PHALANX_ARRAY_ID", ""),
            help="the id of the array this node belongs to, reported in /health "
            "(manage.py nodecredential prints it; default $PHALANX_ARRAY_ID)",
        )
        parser.add_argument(
            "--credential-file",
            default=None,
            help="credentials to accept, one per line, re-read on change "
            "(also: $PHALANX_NODE_CREDENTIAL, comma-separated)",
        )
        parser.add_argument(
            "--no-prefix-reuse", action="store_true", help="prefill every turn (benchmarks)"
        )
        parser.add_argument(
            "--prefix-dir",
            default=None,
            help="where shared prefixes' KV is kept for warm restarts (default "
            "$PHALANX_PREFIX_DIR, else $PHALANX_HOME/prefix-cache; '' keeps none)",
        )
        add_join_arguments(parser)

    def handle(self, *args, **o) -> None:
        from daphne.endpoints import build_endpoint_description_strings
        from daphne.server import Server

        logs.set_process("runnode", node_id=o["id"])  # every record names this node
        host, _, port = o["listen"].rpartition(":")
        if not host or not port.isdigit():
            raise CommandError(f"--listen must be host:port, got {o['listen']!r}")
        if not os.path.exists(o["model"]):
            raise CommandError(f"model file not found: {o['model']}")
        join_if_asked(o, lambda line: self.stdout.write(line, ending="\n"))
        try:
            credentials = CredentialCheck.from_environment(o["credential_file"])
        except NoCredential as exc:
            raise CommandError(str(exc)) from exc
        ship_node_logs(o, credentials)
        if o["cpus"]:
            os.sched_setaffinity(0, parse_cpu_set(o["cpus"]))
        config = engine_config(o)
        package = o["package"] or os.path.splitext(os.path.basename(o["model"]))[0]
        engine = Engine(config)
        engine.start()
        app = NodeApp(
            NodeIdentity(o["id"], package, o["sha256"], o["array_id"]),
            engine,
            chat_service_for,
            credentials,
        )
        app.devices = DeviceValidation(host_from_environment(), lambda: app.engine)
        stop_watch = threading.Event()
        threading.Thread(
            target=app.devices.watch, args=(stop_watch,), name="device-watch", daemon=True
        ).start()
        self.stdout.write(f"node {o['id']} serving {package} on http://{host}:{port}", ending="\n")
        self.stdout.flush()
        try:
            Server(
                application=app,
                endpoints=build_endpoint_description_strings(host=host, port=int(port)),
                verbosity=0,
                action_logger=None,
            ).run()
        finally:
            stop_watch.set()
            app.engine.stop()  # the engine served now (a package switch retired the first)
