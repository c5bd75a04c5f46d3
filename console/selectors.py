"""Reads that compose the console pages (and a few the admin API shares): the array at a
glance, a node, packages with what their GGUF file says, a session's decision log, tokens and
the audit log. A question a feature owns is asked by the feature's selectors
(``inference.selectors``, ``nodes.selectors``) and composed here."""

from __future__ import annotations

import difflib
from typing import Any

from django.core.paginator import Paginator
from django.db.models import Count, Q

from console.models import ArrayConfig, AuditEntry
from inference.models import ModelPackage, PackageJob, SessionRoute
from inference.packages.selectors import count_human, package_facts
from inference.selectors import served_models, session_route
from nodes.models import Node, NodeEvent
from nodes.selectors import nodes_status, nodes_with_sessions


def packages_with_use() -> list[ModelPackage]:
    """Every package with ``node_count``, ``up_count`` (nodes taking traffic on it: the one
    count, ``nodes.selectors.takes_sessions``) and ``sequence_limit`` (the fewest
    tokens a sequence holds on its up nodes, prompt plus output; None until a node reported
    it) annotated, by name then newest."""
    packages = list(
        ModelPackage.objects.annotate(node_count=Count("nodes", distinct=True)).order_by(
            "name", "-created_at"
        )
    )
    limits = sequence_limits()
    up = {v.package_id: v.up for m in served_models() for v in m.versions}
    for package in packages:
        package.sequence_limit = limits.get(package.pk)  # type: ignore[attr-defined]
        package.up_count = up.get(package.pk, 0)  # type: ignore[attr-defined]
    return packages


def sequence_limits() -> dict[int, int]:
    """``{package id: tokens per sequence}``, the smallest over the up nodes serving it, from
    their last metrics (KV capacity over sequences)."""
    limits: dict[int, int] = {}
    rows = Node.objects.filter(state=Node.State.UP, package__isnull=False)
    for package_id, load in rows.values_list("package_id", "last_seen_load"):
        capacity = (load or {}).get("kv_capacity")
        total = (load or {}).get("total")
        if capacity and total:
            limit = int(capacity // total)
            limits[package_id] = min(limit, limits.get(package_id, limit))
    return limits


def overview() -> dict[str, Any]:
    """The array at a glance: nodes, counts by badge (``serving`` counts the nodes routing
    places new sessions on, ``takes_sessions``; ``not_serving`` the validating, starting,
    restarting, failed and standby ones), sessions, recent events and ``failing`` (nodes whose
    probe fails now or that went down, crashed or failed validation in the last hour), from
    the database (live numbers come over the socket)."""
    nodes = nodes_with_sessions()
    by_state = {"serving": 0, "not_serving": 0, "down": 0, "draining": 0}
    for node in nodes:
        badge = node.status.badge  # type: ignore[attr-defined]
        key = badge if badge in by_state else "not_serving"
        by_state[key] += 1
    return {
        "nodes": nodes,
        "by_state": by_state,
        "sessions": SessionRoute.objects.count(),
        "moves": sum(SessionRoute.objects.values_list("moves", flat=True)),
        "failing": [n for n in nodes if n.status.recent_error],  # type: ignore[attr-defined]
        "events": list(NodeEvent.objects.select_related("node")[:15]),
        "packages": ModelPackage.objects.count(),
    }


SESSIONS_PER_PAGE = 25


def node_detail(node_id: str, *, page: int | str | None = 1) -> dict[str, Any] | None:
    """A node, its recent events, pinned sessions (``sessions``: a Django ``Page`` of
    ``SESSIONS_PER_PAGE``, most recently seen first; ``page`` past the end gives the last,
    anything not a number the first) and devices, or None when unknown.

    Devices: the node's CPU set (threads) and the accelerator modules of the config file.
    ``host_ram``: ``{"used_mib", "budget_mib"}`` of idle sessions' KV in the node's host RAM,
    from its last scrape (None before one)."""
    node = Node.objects.select_related("package").filter(node_id=node_id).first()
    if node is None:
        return None
    config = ArrayConfig.load()
    devices = [
        {
            "kind": "CPU",
            "name": f"CPUs {node.cpu_set or 'any'}",
            "detail": f"{node.threads} thread(s)",
        }
    ]
    devices += [
        {"kind": "Accelerator module", "name": m.strip(), "detail": "from config"}
        for m in config.ai_modules.split(",")
        if m.strip()
    ]
    seen = node.last_seen_load or {}
    host_ram = None
    if seen.get("host_ram_budget"):
        host_ram = {
            "used_mib": round((seen.get("host_ram") or 0) / 2**20, 1),
            "budget_mib": round(seen["host_ram_budget"] / 2**20),
        }
    node.status = nodes_status([node])[node_id]  # type: ignore[attr-defined]
    return {
        "node": node,
        "host_ram": host_ram,
        "events": list(node.events.all()[:50]),
        "sessions": Paginator(
            node.session_routes.select_related("package").order_by("-last_seen_at", "-id"),
            SESSIONS_PER_PAGE,
        ).get_page(page),
        "devices": devices,
    }


def session_detail(session_id: str) -> dict[str, Any] | None:
    """A session's route and decision log (oldest first), or None when unknown."""
    route = session_route(session_id=session_id)
    if route is None:
        return None
    return {"route": route, "decisions": list(route.decisions.all())}


def audit_entries(*, limit: int = 200, action: str | None = None) -> list[AuditEntry]:
    """The newest audit entries (at most ``limit``), optionally of one ``action`` prefix
    (``"node."``)."""
    entries = AuditEntry.objects.all()
    if action:
        entries = entries.filter(action__startswith=action)
    return list(entries[:limit])


# --- package pages ---------------------------------------------------------------------------

# evaluation metrics shown as percentages: report key -> label
PERCENT_METRICS = (
    ("tool_accuracy", "Tool accuracy"),
    ("json_parse_rate", "JSON parses"),
    ("schema_valid_rate", "Schema-valid calls"),
    ("name_accuracy", "Right function"),
    ("args_exact", "Exact arguments"),
    ("abstention_accuracy", "Right abstentions"),
)
MODES = ("grammar", "free")


def percent(value: float | None) -> str:
    """A 0..1 share as ``62.5%``; None as ``—``."""
    return "—" if value is None else f"{value * 100:.1f}%"


def _figure(value: float | None, pattern: str) -> str:
    return "—" if value is None else pattern.format(value)


def _mode(evaluation: dict[str, Any] | None, mode: str) -> dict[str, Any]:
    return ((evaluation or {}).get("modes") or {}).get(mode) or {}


def lineage_text(package: ModelPackage) -> str:
    """Where a version came from, in a few words: ``imported from file /x.gguf``, ``built from
    smol:1 as Q4_K_M (f16)``, ``smol:1 with an operator's chat template``."""
    lineage = package.lineage or {}
    kind, origin = lineage.get("kind"), lineage.get("from") or "?"
    if kind == "build":
        requested, method = lineage.get("requested") or "?", lineage.get("method") or "?"
        return f"built from {origin} as {requested} ({method})"
    if kind == "template":
        return f"{origin} with an operator's chat template"
    if kind == "import":
        return f"imported from {origin}"
    return "registered"


def package_jobs(*, package: ModelPackage | None = None, limit: int = 20) -> list[PackageJob]:
    """The newest ``limit`` package jobs with their package and output; of ``package``: the
    jobs run on it and the one that made it."""
    jobs = PackageJob.objects.select_related("package", "output")
    if package is not None:
        jobs = jobs.filter(Q(package=package) | Q(output=package))
    found = list(jobs[:limit])
    for job in found:
        job.colour = PackageJob.STATE_COLOURS.get(job.state, "grey")  # type: ignore[attr-defined]
    return found


def _with_colour(package: ModelPackage) -> ModelPackage:
    """``package`` with ``colour``, its status's (``ModelPackage.STATUS_COLOURS``)."""
    package.colour = ModelPackage.STATUS_COLOURS.get(package.status, "grey")  # type: ignore[attr-defined]
    return package


def packages_page() -> dict[str, Any]:
    """The packages page: ``families`` (``[(family, versions)]``, families by name, versions as
    ``packages_with_use`` with ``accuracy`` (grammar-mode tool accuracy as a percentage, ""
    when not evaluated) and ``origin`` (``lineage_text``)), and the recent ``jobs``."""
    families: dict[str, list[ModelPackage]] = {}
    for package in packages_with_use():
        package.accuracy = _headline(package)  # type: ignore[attr-defined]
        package.origin = lineage_text(package)  # type: ignore[attr-defined]
        families.setdefault(package.family or package.name, []).append(_with_colour(package))
    return {"families": sorted(families.items()), "jobs": package_jobs()}


def _headline(package: ModelPackage) -> str:
    """The list's evaluation figure: grammar-mode tool accuracy of a chat package, the share
    of paraphrases served of an embedding one ("" when not evaluated)."""
    if package.evaluation is None:
        return ""
    if package.kind == ModelPackage.Kind.EMBEDDING:
        return f"{percent(package.evaluation.get('paraphrases_served'))} paraphrases served"
    return percent(_mode(package.evaluation, "grammar").get("tool_accuracy"))


def package_detail(package_id: int, *, diff_id: int | None = None) -> dict[str, Any] | None:
    """Everything the version page shows, or None for an unknown id: the version and its
    file (``facts``), ``nodes`` serving it, its ``tensor_mix``, the versions built from it
    (``children``), the ``build`` report (``build_summary``), the ``evaluation``
    (``evaluation_summary``), the ``family`` comparison, the chat ``template`` diff against
    the parent or version ``diff_id``, its ``jobs`` and its audit ``history``."""
    package = ModelPackage.objects.select_related("parent").filter(pk=package_id).first()
    if package is None:
        return None
    jobs = package_jobs(package=package)
    evaluating = any(j.kind == PackageJob.Kind.EVALUATE and not j.finished for j in jobs)
    final = (ModelPackage.Status.APPROVED, ModelPackage.Status.RETIRED)
    embedding = package.kind == ModelPackage.Kind.EMBEDDING
    return {
        "package": _with_colour(package),
        "facts": package_facts(package),
        "parameters": count_human(package.parameters),
        "tensor_mix": tensor_mix(package.tensor_types),
        "sampling": ", ".join(f"{k} {v}" for k, v in (package.sampling or {}).items()),
        "nodes": list(package.nodes.all()),
        "children": [_with_colour(c) for c in package.children.order_by("created_at", "id")],
        "moves": ModelPackage.STATUS_MOVES[package.status],
        "evaluable": package.status not in final and not evaluating and not embedding,
        "build": build_summary(package.build_report),
        "evaluation": None if embedding else evaluation_summary(package.evaluation),
        "embedding_evaluation": package.evaluation if embedding else None,
        "family": family_comparison(package),
        "template": template_comparison(package, diff_id),
        "jobs": jobs,
        "history": list(AuditEntry.objects.filter(target=package.key)[:100]),
    }


def tensor_mix(types: dict[str, int] | None) -> list[tuple[str, int]]:
    """``{"F32": 61, "Q4_1": 182}`` -> ``[("Q4_1", 182), ("F32", 61)]``: most tensors first."""
    return sorted((types or {}).items(), key=lambda item: (-item[1], item[0]))


def build_summary(report: dict[str, Any] | None) -> dict[str, Any] | None:
    """A build report (``inference.packages.build.BuildReport``) with ``tensor_mix``,
    ``fallbacks`` (``[(type, count)]``) and ``warning``: when most quantized tensors fell back,
    ``"Q4_K_M was requested but 180 of 272 tensors fell back to Q5_0/Q8_0."``, else ""."""
    if not report:
        return None
    fallbacks = tensor_mix(report.get("fallback_types"))
    warning = ""
    if report.get("mostly_fell_back"):
        to = "/".join(sorted(t for t, _ in fallbacks)) or "other types"
        warning = (
            f"{report.get('requested')} was requested but {report.get('fallback_count')} of "
            f"{report.get('quantized_tensors')} tensors fell back to {to}."
        )
    return {
        **report,
        "tensor_mix": tensor_mix(report.get("tensor_types")),
        "fallbacks": fallbacks,
        "warning": warning,
    }


def evaluation_summary(report: dict[str, Any] | None) -> dict[str, Any] | None:
    """An evaluation report as the page shows it: the smoke test (``smoke_passed``,
    ``smoke_error``, ``steps``), ``modes`` measured (grammar, free), ``metrics``
    (``[(label, [percent per mode])]``), ``cases`` per mode, ``ttft``, ``decode``,
    ``perplexity`` and ``seconds`` as text, ``suite`` (its scalar facts)."""
    if report is None:
        return None
    smoke = report.get("smoke") or {}
    measured = report.get("modes") or {}
    modes = [m for m in MODES if m in measured] + [m for m in measured if m not in MODES]
    speed = report.get("speed") or {}
    return {
        "smoke_passed": bool(smoke.get("passed")),
        "smoke_error": smoke.get("error") or "",
        "steps": smoke.get("steps") or [],
        "modes": modes,
        "metrics": [
            (label, [percent(_mode(report, m).get(key)) for m in modes])
            for key, label in PERCENT_METRICS
        ],
        "cases": [_mode(report, m).get("cases", "—") for m in modes],
        "ttft": _figure(speed.get("ttft_ms"), "{:.0f} ms"),
        "decode": _figure(speed.get("decode_tok_s"), "{:.1f} tok/s"),
        "perplexity": _figure(report.get("perplexity"), "{:.2f}"),
        "seconds": _figure(report.get("seconds"), "{:.0f} s"),
        "suite": {
            k: v for k, v in (report.get("suite") or {}).items() if isinstance(v, str | int | float)
        },
    }


def family_comparison(package: ModelPackage) -> dict[str, Any]:
    """Every evaluated version of ``package``'s family, oldest first: ``rows`` for the table
    and ``points`` for the chart (``{"id", "key", "quantization", "status", "colour",
    "current", "size_mib", "tool_accuracy" (0..1, grammar mode), "decode_tok_s"}``, only the
    versions with a size and a tool accuracy; the others' keys are in ``not_drawn``)."""
    versions = ModelPackage.objects.filter(evaluation__isnull=False).order_by("created_at", "id")
    if package.family:
        versions = versions.filter(family=package.family)
    else:
        versions = versions.filter(name=package.name)
    rows, points, not_drawn = [], [], []
    for version in versions:
        report = version.evaluation or {}
        grammar, speed = _mode(report, "grammar"), report.get("speed") or {}
        size_mib = round(version.size_bytes / 2**20, 1) if version.size_bytes else None
        rows.append(
            {
                "package": version,
                "current": version.pk == package.pk,
                "colour": ModelPackage.STATUS_COLOURS.get(version.status, "grey"),
                "size_mib": _figure(size_mib, "{:.1f}"),
                "tool_accuracy": percent(grammar.get("tool_accuracy")),
                "free_accuracy": percent(_mode(report, "free").get("tool_accuracy")),
                "schema_valid": percent(grammar.get("schema_valid_rate")),
                "ttft": _figure(speed.get("ttft_ms"), "{:.0f} ms"),
                "decode": _figure(speed.get("decode_tok_s"), "{:.1f}"),
                "perplexity": _figure(report.get("perplexity"), "{:.2f}"),
                "gate": (version.gate or {}).get("summary") or "—",
            }
        )
        if size_mib is None or grammar.get("tool_accuracy") is None:
            not_drawn.append(version.key)
            continue
        points.append(
            {
                "id": version.pk,
                "key": version.key,
                "quantization": version.quantization,
                "status": version.status,
                "colour": ModelPackage.STATUS_COLOURS.get(version.status, "grey"),
                "current": version.pk == package.pk,
                "size_mib": size_mib,
                "tool_accuracy": grammar.get("tool_accuracy"),
                "decode_tok_s": speed.get("decode_tok_s"),
            }
        )
    return {"rows": rows, "points": points, "not_drawn": not_drawn}


def template_comparison(package: ModelPackage, diff_id: int | None = None) -> dict[str, Any]:
    """``package``'s chat template against another version's: version ``diff_id`` when it is
    one of the ``choices`` (the family's other versions and the parent), else the parent.
    ``against`` (the other version or None), ``identical``, ``lines`` (``[(kind, text)]`` of
    a unified diff, kind ``add`` / ``del`` / ``hunk`` / ``head`` / ``same``; an absent template
    reads ``(none)``)."""
    family = ModelPackage.objects.exclude(pk=package.pk).order_by("-created_at", "-id")
    family = family.filter(family=package.family) if package.family else family.none()
    choices = list(family)
    if package.parent is not None and package.parent not in choices:
        choices.append(package.parent)
    against = next((c for c in choices if c.pk == diff_id), None) or package.parent
    identical = against is not None and against.chat_template == package.chat_template
    lines: list[tuple[str, str]] = []
    if against is not None and not identical:
        before = (against.chat_template or "(none)").splitlines()
        after = (package.chat_template or "(none)").splitlines()
        diff = difflib.unified_diff(before, after, against.key, package.key, lineterm="")
        lines = [(_diff_kind(line), line) for line in diff]
    return {"against": against, "choices": choices, "identical": identical, "lines": lines}


def _diff_kind(line: str) -> str:
    if line.startswith(("+++", "---")):
        return "head"
    if line.startswith("@@"):
        return "hunk"
    return {"+": "add", "-": "del"}.get(line[:1], "same")
