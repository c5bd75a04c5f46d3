"""``manage.py up [--nodes 2] [--port 8000] [--replicas 1]``: run the embedded array on this
machine.

``--replicas N`` (N > 1 needs ``DATABASE_URL`` and ``REDIS_URL``: the replicas share PostgreSQL
and Redis, docs/control-plane.md "Replicas") starts N control-plane processes that all accept
from one listening socket on ``--port``, which ``up`` binds and hands down; one that exits is
started again while the others serve.

Migrates, bootstraps, starts the control plane (daphne), the control loop and N node agents as
child processes, prints the console URL, admin login and API token, then, live, each node's
stage (loading, validating, takes sessions, kept out) and "ready" with the OpenAI base URL once
sessions can be placed on every node that passed (``nodes.startup``); on Ctrl-C or SIGTERM
stops every child (SIGTERM, then SIGKILL after a timeout).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from console.embedded import (
    NODE_HOST,
    Backoff,
    Supervisor,
    array_bootstrap,
    control_loop_command,
    control_plane_command,
    listening_socket,
    node_command_now,
    node_environment,
    node_restart_done,
    nodes_mark_starting,
    nodes_mark_stopped,
    ports_taken,
    restarts_due,
    serving_type_choose,
    wait_for_port,
)
from console.lib.log_shipping import ship_from_here, to_database
from inference.engine.config import default_host_ram_mib
from inference.models import RoutingPolicy
from nodes.client import probe
from nodes.control import ControlLoop
from nodes.management.commands.bootstrap import describe
from nodes.services import node_record_restart
from nodes.startup import StartupWatch, validation_estimate


class _Stop(BaseException):
    """Ctrl-C or SIGTERM: stop the array. A BaseException, so no ``except Exception`` on
    the way (a database call, a restart) swallows it."""


_stopping: list[int] = []  # the signals received: only the first one stops the array


def _raise_stop(signum: int, frame: object) -> None:
    """The first SIGINT/SIGTERM stops the array; any that follow (a second Ctrl-C, ``make``
    passing SIGTERM on while the terminal sent SIGINT) are noted and do nothing, so the stop
    runs to its end and exits 0 (the handler stays installed: replacing it here, with a
    signal pending, makes Python print "ignored due to race condition")."""
    _stopping.append(signum)
    if len(_stopping) == 1:
        raise _Stop()


def _start_nodes(supervisor: Supervisor, result, *, control_plane_url: str) -> None:
    """Start a node agent for each node of ``result`` (``array_bootstrap``'s), shipping its
    log records to ``control_plane_url``. The nodes share this machine's memory: each gets
    its part of the default host-RAM share."""
    budget = default_host_ram_mib(
        psutil.virtual_memory().available, nodes_on_machine=len(result.nodes)
    )
    for node in result.nodes:
        supervisor.start(
            node.node_id,
            node_command_now(node.node_id, fallback=result.model_path, host_ram_mib=budget),
            env=node_environment(node, control_plane_url=control_plane_url),
        )


CORE = ("control plane", "control loop")
MAX_REPLICAS = 16
MAX_REPLICA_RESTARTS = 5  # in a row: past it a replica crash-loops, and the array stops


def _is_core(name: str) -> bool:
    """A process whose exit stops the array: the one control plane or the control loop (a
    replica of several is restarted, as a node agent is, while the others serve)."""
    return name in CORE


def _is_replica(name: str) -> bool:
    return name.startswith("control plane ")


def _check_replicas(replicas: int) -> None:
    """Raises ``CommandError`` naming what is wrong with ``--replicas``."""
    if not 1 <= replicas <= MAX_REPLICAS:
        raise CommandError(f"--replicas: a whole number from 1 to {MAX_REPLICAS}")
    missing = [name for name in ("DATABASE_URL", "REDIS_URL") if not os.environ.get(name)]
    if replicas > 1 and missing:
        raise CommandError(
            f"--replicas {replicas} needs {' and '.join(missing)}: replicas share PostgreSQL "
            "(DATABASE_URL) and Redis (REDIS_URL); one replica runs on the embedded SQLite"
        )


def _start_control_planes(
    supervisor: Supervisor, *, host: str, port: int, replicas: int, env: dict[str, str]
) -> None:
    """One control plane binding ``host:port`` itself, or ``replicas`` of them accepting from
    one listening socket this process binds (the kernel spreads connections over them)."""
    if replicas == 1:
        supervisor.start("control plane", control_plane_command(port=port, host=host), env=env)
        return
    shared = listening_socket(host, port)
    supervisor.sockets.append(shared)  # a restarted replica accepts from it again
    for i in range(1, replicas + 1):
        command = control_plane_command(port=port, host=host, fd=shared.fileno())
        supervisor.start(f"control plane {i}", command, env=env, pass_fds=[shared.fileno()])


def _forget(node_ids: list[str]) -> None:
    """The nodes' rows no longer name this process as their supervisor (best effort)."""
    try:
        nodes_mark_stopped(node_ids)
    except DatabaseError:
        pass


def _loopback(host: str) -> str:
    """The address this machine reaches a control plane bound to ``host`` at."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


class Command(BaseCommand):
    help = "Start the control plane, the control loop and N local node agents; Ctrl-C stops all."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--nodes", type=int, default=2)
        parser.add_argument(
            "--node-port",
            type=int,
            default=None,
            help="port of node-01; node-N gets +N-1 (default: the control plane's port + 1)",
        )
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--host", default="127.0.0.1", help="control plane bind address")
        parser.add_argument(
            "--replicas",
            type=int,
            default=1,
            help="control-plane processes behind --port (more than 1 needs DATABASE_URL and "
            "REDIS_URL)",
        )
        parser.add_argument(
            "--stop-timeout",
            type=float,
            default=10.0,
            help="seconds to wait after SIGTERM before SIGKILL",
        )

    def handle(self, *args, **options) -> None:
        _stopping.clear()
        signal.signal(signal.SIGTERM, _raise_stop)
        signal.signal(signal.SIGINT, _raise_stop)
        try:
            self._run(**options)
        except _Stop:  # stopped before anything was started (migrating, bootstrapping)
            self.stdout.write("stopped")

    def _run(self, **options) -> None:
        """Start the array and watch it until a signal or a core process exits."""
        port, host = options["port"], options["host"]
        _check_replicas(options["replicas"])
        node_port = options["node_port"] or port + 1
        taken = ports_taken(
            [(host, port), *((NODE_HOST, node_port + i) for i in range(options["nodes"]))]
        )
        if taken:
            raise CommandError(
                f"taken: {', '.join(taken)} (another array, or another program, listens "
                "there); choose other ports: make run PORT=<port> (nodes use the next ports), "
                "or manage.py up --port <port> --node-port <port>"
            )
        call_command("migrate", interactive=False, verbosity=0)
        ship_from_here("up", to_database())
        try:
            result = array_bootstrap(nodes=options["nodes"], node_base_port=node_port)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(serving_type_choose(result))
        node_ids = [n.node_id for n in result.nodes]
        nodes_mark_starting(node_ids)  # the rows are a previous process's: not up, not validated
        supervisor = Supervisor()
        code = 0
        try:
            # load tests send their traffic to this control plane (settings.LOADTEST_TARGET_URL)
            own_url = {"PHALANX_URL": f"http://{_loopback(host)}:{port}"}
            _start_control_planes(
                supervisor, host=host, port=port, replicas=options["replicas"], env=own_url
            )
            supervisor.start("control loop", control_loop_command(), env=own_url)
            _start_nodes(supervisor, result, control_plane_url=own_url["PHALANX_URL"])
            ready = wait_for_port(host, port, timeout=60)
            self._wait_for_nodes(result.nodes, supervisor)
            for line in describe(result):
                self.stdout.write(line)
            base = f"http://{host}:{port}"
            self.stdout.write(f"console: {base}/" + ("" if ready else " (not answering yet)"))
            self.stdout.write(
                "not ready yet: a node takes sessions once its devices are validated "
                f"({base}/validation/); {validation_estimate(node_ids).text}"
            )
            self.stdout.write("Ctrl-C stops everything.")
            code = self._watch(supervisor, startup=StartupWatch(node_ids, base_url=base))
        except _Stop:
            pass  # a clean stop says one line, below, and exits 0
        finally:
            _stopping.append(0)  # from here on a signal does not interrupt the stop
            supervisor.stop(timeout=options["stop_timeout"])
            _forget(node_ids)
            self.stdout.write("all processes stopped")
        if code:
            raise CommandError(f"a core process exited with status {code}")

    def _wait_for_nodes(self, nodes: list, supervisor: Supervisor, timeout: float = 180.0) -> None:
        """Block until every node answers ``/health`` 200 (model loaded) or ``timeout`` s pass,
        then run one health-check round so they are marked up (and their validations queued)."""
        deadline = time.monotonic() + timeout
        waiting = {n.node_id: n.address for n in nodes}
        while waiting and time.monotonic() < deadline and not supervisor.exited():
            for node_id, address in list(waiting.items()):
                if probe(address, node_id=node_id, timeout=1.0).ok:
                    self.stdout.write(f"{node_id} loaded its model")
                    del waiting[node_id]
            time.sleep(0.3)
        for node_id in waiting:
            self.stderr.write(
                f"{node_id} not ready after {timeout:.0f} s; the control loop keeps checking"
            )
        ControlLoop().tick()

    def _watch(
        self,
        supervisor: Supervisor,
        backoff: Backoff | None = None,
        startup: StartupWatch | None = None,
    ) -> int:
        """Wait; a node agent that exits is restarted after a backoff (``Backoff``), with a
        ``restarted`` event on its page; the control plane or control loop exiting stops the
        array (returns its status). ``startup``'s lines (each node's stage, "ready") are
        printed as they change."""
        backoff = backoff or Backoff()
        in_a_row: dict[str, int] = {}
        due: dict[str, float] = {}  # node -> when to start it again
        while True:
            time.sleep(0.5)
            now = time.monotonic()
            self._say(startup)
            agents = [n for n in supervisor.commands if not _is_core(n) and not _is_replica(n)]
            self._restart_requested(supervisor, agents)
            for name, returncode in supervisor.exited():
                if _is_core(name):
                    self.stderr.write(f"{name} exited with status {returncode}")
                    return returncode or 1
                if name in due:
                    continue
                ran_s = now - supervisor.started_at[name]
                restarts = 0 if ran_s >= backoff.stable_s else in_a_row.get(name, -1) + 1
                in_a_row[name] = restarts
                if _is_replica(name) and restarts >= MAX_REPLICA_RESTARTS:
                    self.stderr.write(f"{name} exited {restarts + 1} times in a row; stopping")
                    return returncode or 1  # a crash loop (a wrong DATABASE_URL ...) ends here
                delay = backoff.delay(restarts)
                due[name] = now + delay
                what = "replica" if _is_replica(name) else "node agent"
                message = (
                    f"{what} exited with status {returncode} after {ran_s:.0f} s; "
                    f"restarting in {delay:.0f} s"
                    + (f" ({restarts + 1} in a row)" if restarts else "")
                )
                self.stderr.write(f"{name}: {message}")
                if not _is_replica(name):
                    node_record_restart(node_id=name, message=message)
            for name, at in list(due.items()):
                if now >= at:
                    if _is_replica(name):
                        supervisor.restart(name)
                    else:
                        self._restart_node(supervisor, name)
                    del due[name]

    def _restart_requested(self, supervisor: Supervisor, names: list[str]) -> None:
        """Restart the agents an operator asked to restart, once drained (``restarts_due``):
        this process started them, so it stops and starts them itself (a busy database: the
        next poll does it)."""
        try:
            due = restarts_due(names, drain_wait_s=RoutingPolicy.load().request_timeout_s)
            for name in due:
                status = supervisor.stop_one(name)
                self._restart_node(supervisor, name)
                node_restart_done(name, status=status)
                self.stdout.write(f"{name} restarted at an operator's request")
        except DatabaseError:
            return

    def _say(self, startup: StartupWatch | None) -> None:
        """Print what changed in the array's start-up (nothing when the database is busy:
        the next poll says it)."""
        if startup is None:
            return
        try:
            lines = startup.poll()
        except DatabaseError:
            return
        for line in lines:
            self.stdout.write(line)
        if lines:
            self.stdout.flush()  # a pipe (make run | tee) sees each line as it happens

    @staticmethod
    def _restart_node(supervisor: Supervisor, name: str) -> None:
        """Start a node agent again with what the database says it serves now (an upgrade may
        have switched it since it was started); as it was started when that cannot be read."""
        argv, env = supervisor.commands[name]
        try:
            model = Path(argv[argv.index("--model") + 1])
            budget = argv[argv.index("--host-ram-mib") + 1] if "--host-ram-mib" in argv else None
            argv = node_command_now(
                name, fallback=model, host_ram_mib=int(budget) if budget else None
            )
        except Exception:  # the database is busy or gone: the command it had is still right
            pass
        supervisor.start(name, argv, env=env)
