"""The embedded array: bootstrap the inventory for one machine and supervise its processes.

``manage.py bootstrap`` and ``manage.py up`` are thin wrappers over this module.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from console.lib.access import Role
from console.lib.log_shipping import ENV_LOGS_URL
from console.lib.processes import die_with_parent
from inference.bundled import SMOLLM2_135M, ensure_bundled_model
from inference.models import ModelPackage
from inference.packages.services import package_import_file
from inference.packages.serving_default import serving_default_start
from inference.semcache.package import embedding_package_register
from inference.tokens import ENV_TOKEN, token_issue
from nodes.agent.auth import ENV_CREDENTIAL, ENV_PROOF_KEY
from nodes.credentials import array_id, node_keys
from nodes.models import Node
from nodes.services import node_record_restart, node_undrain, node_upsert

BUNDLED_PACKAGE_NAME = "smollm2-135m-instruct-q4_1"
BUNDLED_PACKAGE_VERSION = "1"
NODE_HOST = "127.0.0.1"
NODE_BASE_PORT = 8001  # the default control-plane port (8000) + 1
ADMIN_USER = "admin"  # the bootstrap user is a superuser: its name says its role


@dataclass(frozen=True)
class BootstrapResult:
    """What ``array_bootstrap`` made: the package, the nodes (and their model file), the
    admin user's password when it was just created (else None) and an API token (plaintext,
    or None when ``$PHALANX_API_TOKEN`` is in use)."""

    package: ModelPackage
    model_path: Path
    nodes: list[Node]
    admin_password: str | None
    api_token: str | None


def cpu_count() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def node_cpu(index: int) -> str:
    """CPU list for the ``index``-th (0-based) local node: one CPU each, wrapping round."""
    cpus = (
        sorted(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else list(range(os.cpu_count() or 1))
    )
    return str(cpus[index % len(cpus)])


def package_register_bundled(model_path: Path) -> ModelPackage:
    """Import the bundled GGUF as ``smollm2-135m-instruct-q4_1:1`` into the package store
    (idempotent), with what the file says of itself; a draft until it is evaluated."""
    known = ModelPackage.objects.filter(
        name=BUNDLED_PACKAGE_NAME, version=BUNDLED_PACKAGE_VERSION, sha256=SMOLLM2_135M.sha256
    ).first()
    if known is not None:
        return known
    imported = package_import_file(
        path=model_path,
        name=BUNDLED_PACKAGE_NAME,
        version=BUNDLED_PACKAGE_VERSION,
        source={
            "kind": "import",
            "from": f"python package {SMOLLM2_135M.package}=={SMOLLM2_135M.version}",
            "checked_against": f"sha256 {SMOLLM2_135M.sha256}",
        },
    )
    return imported.package


def array_bootstrap(
    *, nodes: int, mint_token: bool = True, node_base_port: int = NODE_BASE_PORT
) -> BootstrapResult:
    """Make the embedded array's inventory (idempotent): the bundled model on disk and
    registered, the sentence encoder registered and gated as the embedding package
    ``all-minilm-l6-v2`` (``inference.semcache.package``), nodes ``node-01..node-NN`` at ``127.0.0.1:<node_base_port>..``, one CPU each, an ``admin``
    superuser, and a fresh API token unless ``$PHALANX_API_TOKEN`` is set.

    ``$PHALANX_ADMIN_PASSWORD`` (or the older ``$PHALANX_OPERATOR_PASSWORD``), when set, becomes
    the ``admin`` user's password (created or not).
    Raises ``ValueError`` for ``nodes < 1``; download and checksum errors from
    ``ensure_bundled_model``.
    """
    if nodes < 1:
        raise ValueError("--nodes must be at least 1")
    model_path = ensure_bundled_model(settings.MODEL_DIR)
    with transaction.atomic():
        package = package_register_bundled(model_path)
        known = {
            n: (p, t) for n, p, t in Node.objects.values_list("node_id", "package_id", "threads")
        }
        made = [
            node_upsert(
                node_id=node_id,
                address=f"{NODE_HOST}:{node_base_port + i}",
                # a node keeps what it was given (an upgrade's version and threads); a new one
                # the bundled package and one thread
                package_id=known.get(node_id, (None,))[0] or package.pk,
                cpu_set=node_cpu(i),
                threads=known.get(node_id, (None, 1))[1] or 1,
            )[0]
            for i, node_id in ((i, f"node-{i + 1:02d}") for i in range(nodes))
        ]
        password = _ensure_admin_user()
        token = None
        if mint_token and not os.environ.get(ENV_TOKEN):
            token = token_issue(
                name=f"bootstrap {time.strftime('%Y-%m-%d %H:%M:%S')}", role=Role.ADMIN
            )[1]
    embedding_package_register()  # the semantic cache's encoder, gated (about 2 s, once)
    stored = Path(package.gguf_path)
    return BootstrapResult(
        package, stored if stored.is_file() else model_path, made, password, token
    )


def serving_type_choose(result: BootstrapResult) -> str:
    """``serving_default_start`` for the bundled package at the nodes' thread count: what
    ``up`` prints. A type that cannot be made or timed is said, and the nodes keep the
    bundled file."""
    from inference.engine.llama import LlamaError
    from inference.engine.quantize import QuantizeError

    threads = max((node.threads or 1 for node in result.nodes), default=1)
    try:
        return serving_default_start(result.package, threads=threads)
    except (LlamaError, QuantizeError, OSError) as exc:
        return f"serving type: {result.package.quantization} (the types could not be timed: {exc})"


def _ensure_admin_user() -> str | None:
    users = get_user_model()
    wanted = os.environ.get("PHALANX_ADMIN_PASSWORD") or os.environ.get("PHALANX_OPERATOR_PASSWORD")
    user = users.objects.filter(username=ADMIN_USER).first()
    if user is None:
        password = wanted or secrets.token_urlsafe(12)
        users.objects.create_superuser(ADMIN_USER, email="", password=password)
        return password
    if wanted:
        user.set_password(wanted)
        user.save(update_fields=["password"])
        return wanted
    return None


# --- processes ------------------------------------------------------------------------------


def node_command(
    node: Node, *, model_path: Path, package: ModelPackage, host_ram_mib: int | None = None
) -> list[str]:
    """The command line that starts a local node agent for ``node``; ``host_ram_mib`` is its
    budget for idle sessions' KV (None: the node's own default). The node serves ``package``
    under its served name (``Node.model_name``: what clients ask for)."""
    rolled = node.engine_settings or {}  # what an upgrade gave it
    host_ram_mib = rolled.get("host_ram_mib", host_ram_mib)
    budget = ["--host-ram-mib", str(host_ram_mib)] if host_ram_mib else []
    for key, flag in (("sequences", "--sequences"), ("ctx_per_seq", "--ctx-per-seq")):
        if key in rolled:
            budget += [flag, str(rolled[key])]
    return [
        sys.executable,
        str(Path(settings.BASE_DIR) / "manage.py"),
        "runnode",
        "--id",
        node.node_id,
        "--listen",
        node.address,
        "--model",
        str(model_path),
        "--package",
        node.served_name or package.name,
        "--sha256",
        package.sha256,
        "--threads",
        str(node.threads),
        "--cpus",
        node.cpu_set or "0",
        *budget,
    ]


def node_command_now(node_id: str, *, fallback: Path, host_ram_mib: int | None = None) -> list[str]:
    """``node_command`` for the node as the database says now: its package's file (the one an
    upgrade gave it; ``fallback`` when the node has none or the file is gone) and served name.
    ``up`` starts and restarts nodes with it, so a restart never undoes an upgrade."""
    node = Node.objects.select_related("package").get(node_id=node_id)
    package = node.package
    path = Path(package.gguf_path) if package else fallback
    if package is None or not path.is_file():  # serve the bundled file, as bootstrap does
        package = ModelPackage.objects.get(
            name=BUNDLED_PACKAGE_NAME, version=BUNDLED_PACKAGE_VERSION
        )
        path = fallback
    return node_command(node, model_path=path, package=package, host_ram_mib=host_ram_mib)


def node_environment(node: Node, *, control_plane_url: str = "") -> dict[str, str]:
    """What a local node agent gets beside its command line: its credential and proof key (in
    the environment, not on the command line, where every local user could read them), the
    array's id (reported in its ``/health``) and, given, the control plane it ships its log
    records to (``$PHALANX_LOGS_URL``)."""
    keys = node_keys(node.node_id)
    env = {
        ENV_CREDENTIAL: keys.credential,
        ENV_PROOF_KEY: keys.proof_key,
        "PHALANX_ARRAY_ID": array_id(),
    }
    return env | ({ENV_LOGS_URL: control_plane_url} if control_plane_url else {})


def control_plane_command(
    *, port: int, host: str = "127.0.0.1", fd: int | None = None
) -> list[str]:
    """``manage.py serve --host HOST --port PORT`` (daphne) with this interpreter; with ``fd``,
    serving on that inherited listening socket (``--fd``) instead of binding its own."""
    manage = str(Path(settings.BASE_DIR) / "manage.py")
    command = [sys.executable, manage, "serve", "--host", host, "--port", str(port)]
    return command + ["--fd", str(fd)] if fd is not None else command


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` and listening, inheritable by child processes: the
    one port that ``up --replicas N``'s control-plane replicas all accept from. Raises
    ``OSError`` when the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


def control_loop_command() -> list[str]:
    return [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "controlloop"]


@dataclass(frozen=True)
class Backoff:
    """Delays before restarting a child that exited: ``first_s``, doubling per restart in a
    row, at most ``max_s``; a child that ran ``stable_s`` before exiting starts over at
    ``first_s`` (a crash now and then is not a crash loop)."""

    first_s: float = 1.0
    max_s: float = 60.0
    stable_s: float = 60.0

    def delay(self, restarts_in_a_row: int) -> float:
        """Seconds to wait before restart number ``restarts_in_a_row + 1``."""
        return min(self.max_s, self.first_s * 2**restarts_in_a_row)


@dataclass
class Supervisor:
    """Starts child processes in their own process groups, restarts one on demand, and stops
    them all together."""

    children: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    commands: dict[str, tuple[list[str], dict[str, str]]] = field(default_factory=dict)
    started_at: dict[str, float] = field(default_factory=dict)
    fds: dict[str, tuple[int, ...]] = field(default_factory=dict)  # passed on at each start
    sockets: list[socket.socket] = field(default_factory=list)  # kept open for restarts

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        pass_fds: Sequence[int] = (),
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` with this environment plus ``env`` (and the file descriptors
        ``pass_fds`` open in the child: a listening socket replicas share)."""
        process = subprocess.Popen(
            list(argv),
            cwd=settings.BASE_DIR,
            env={**os.environ, **(env or {})},
            start_new_session=True,
            preexec_fn=die_with_parent,  # no orphan keeps the array's ports
            pass_fds=tuple(pass_fds),
        )
        self.children = [(n, p) for n, p in self.children if n != name]
        self.children.append((name, process))
        self.commands[name] = (list(argv), dict(env or {}))
        self.fds[name] = tuple(pass_fds)
        self.started_at[name] = time.monotonic()
        return process

    def restart(self, name: str) -> subprocess.Popen[bytes]:
        """Start ``name`` again with the command, environment and file descriptors it was
        started with."""
        argv, env = self.commands[name]
        return self.start(name, argv, env=env, pass_fds=self.fds.get(name, ()))

    def stop_one(self, name: str, *, timeout: float = 10.0) -> int | None:
        """SIGTERM child ``name``'s group (a process this supervisor started), wait up to
        ``timeout`` s, then SIGKILL; returns its exit status (None: no such child)."""
        process = next((p for n, p in self.children if n == name), None)
        if process is None:
            return None
        _signal_group(process, signal.SIGTERM)
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            return process.wait(timeout=5)

    def exited(self) -> list[tuple[str, int]]:
        """``(name, returncode)`` of children that have exited."""
        return [(name, p.returncode) for name, p in self.children if p.poll() is not None]

    def stop(self, *, timeout: float = 10.0) -> None:
        """SIGTERM every child (its whole group), wait up to ``timeout`` s, then SIGKILL."""
        for _, process in self.children:
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for _, process in self.children:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait(timeout=5)


def _signal_group(process: subprocess.Popen[bytes], sig: int) -> None:
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            process.send_signal(sig)
        except ProcessLookupError:
            pass


def ports_taken(addresses: Sequence[tuple[str, int]]) -> list[str]:
    """``"host:port"`` of each address something already listens on (or we may not bind)."""
    taken = []
    for host, port in addresses:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind
            try:
                sock.bind((host, port))
            except OSError:
                taken.append(f"{host}:{port}")
    return taken


def wait_for_port(host: str, port: int, *, timeout: float) -> bool:
    """True once ``host:port`` accepts TCP connections, False after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.2)
    return False


# --- start-up: what the array can serve ------------------------------------------------------


def supervisor_name() -> str:
    """How a node row names the ``up`` process that started its agent: ``"up, pid 4242 on
    host"``."""
    return f"up, pid {os.getpid()} on {socket.gethostname()}"[:128]


def nodes_mark_stopped(node_ids: Sequence[str]) -> int:
    """When ``up`` stops: its nodes have no supervisor any more (no Restart on their pages)
    and no restart pending. Returns how many rows it changed."""
    return Node.objects.filter(node_id__in=node_ids, supervisor=supervisor_name()).update(
        supervisor="", restart_requested_at=None, restart_requested_by=""
    )


def restarts_due(node_ids: Sequence[str], *, drain_wait_s: float) -> list[str]:
    """Nodes of ``node_ids`` an operator asked to restart (``node_request_restart``) that may
    be stopped now: draining, and a probe after the request saw no stream in flight (its
    ``/metrics``: active and queued 0), or ``drain_wait_s`` passed since the request (a stream
    longer than the request timeout would be cut anyway)."""
    due = []
    now = timezone.now()
    for node in Node.objects.filter(node_id__in=node_ids, restart_requested_at__isnull=False):
        load = node.last_seen_load or {}
        probed_after = node.last_probe_at is not None and (
            node.last_probe_at > node.restart_requested_at
        )
        idle = probed_after and not load.get("active") and not load.get("queue") and load
        waited = (now - node.restart_requested_at).total_seconds() >= drain_wait_s
        if node.state == Node.State.DRAINING and (idle or waited):
            due.append(node.node_id)
    return due


def node_restart_done(node_id: str, *, status: int | None) -> None:
    """After ``up`` restarted a node's agent at an operator's request: the ``restarted`` event
    (by that operator), the request cleared, and the node undrained if the request drained it
    (its new agent is validated before it takes traffic, as any restarted agent is)."""
    node = Node.objects.filter(node_id=node_id).first()
    if node is None:
        return
    by = node.restart_requested_by or "operator"
    node_record_restart(
        node_id=node_id,
        message=f"restarted at the request of {by}: drained first, its agent stopped "
        f"(status {status}) and started again",
        actor=by,
    )
    undrain = node.restart_undrain
    Node.objects.filter(pk=node.pk).update(
        restart_requested_at=None, restart_requested_by="", restart_undrain=False
    )
    if undrain:
        node_undrain(node_id=node_id, by=by)


def nodes_mark_starting(node_ids: Sequence[str]) -> int:
    """Before ``up`` starts its node agents: what the database says of them is a previous
    process's, so each is ``unknown`` (not ``up``: it is loading; a draining node stays
    draining) with no load, and ``pending`` validation unless waived (its new agent is
    validated before it takes traffic, as any restarted agent is), and supervised by this
    ``up`` (``supervisor_name``: it may restart them). Returns how many it reset."""
    nodes = Node.objects.filter(node_id__in=node_ids)
    nodes.exclude(state=Node.State.DRAINING).update(state=Node.State.UNKNOWN)
    nodes.update(supervisor=supervisor_name(), restart_requested_at=None, restart_requested_by="")
    nodes.exclude(validation=Node.Validation.WAIVED).update(
        validation=Node.Validation.PENDING, validation_reason="agent starting: to be validated"
    )
    return nodes.update(consecutive_failures=0, consecutive_successes=0, last_seen_load=None)
