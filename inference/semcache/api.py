"""``/api/cache``: the semantic cache's report (viewers), its rules per namespace and its
invalidation (operators, audited). docs/semcache.md."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from django.http import HttpRequest
from ninja import Field, Router, Schema

from console.lib.access import NEEDS_OPERATOR, NEEDS_VIEWER
from console.lib.audit import audit_record
from console.lib.errors import Invalid
from inference.semcache import service

router = Router(tags=["semantic cache"])
NAMESPACE = re.compile(r"answers:[A-Za-z0-9_.:/-]{1,150}|tools:[A-Za-z0-9_.-]{1,64}")
FORBID_EXTRA = {"extra": "forbid"}  # a misspelt field is a 422 naming it, not ignored


class NamespaceOut(Schema):
    name: str
    entries: int
    enabled: bool = Field(
        description="whether lookups and stores happen (its rules, or the answers' defaults)"
    )
    threshold: float | None
    ttl_s: float | None
    max_entries: int | None
    lookups: int
    hits: int
    exact_hits: int
    hit_rate: float | None
    refused_by_check: int
    false_hits: int
    tokens_saved: int
    seconds_saved: float


class FalseHitOut(Schema):
    namespace: str
    entry_id: int
    query: str
    cached_text: str
    note: str
    at: datetime


class CacheOut(Schema):
    namespaces: list[NamespaceOut]
    false_hits: list[FalseHitOut]


def _namespace_out(row: service.NamespaceReport) -> dict:
    counters = row.counters
    rules = row.rules
    return {
        "name": row.name,
        "entries": row.entries,
        "enabled": rules is not None,
        "threshold": rules.threshold if rules else None,
        "ttl_s": rules.ttl_s if rules else None,
        "max_entries": rules.max_entries if rules else None,
        "hit_rate": row.hit_rate,
        "seconds_saved": round(counters["seconds_saved"], 3),
        **{
            name: int(counters[name])
            for name in (
                "lookups",
                "hits",
                "exact_hits",
                "refused_by_check",
                "false_hits",
                "tokens_saved",
            )
        },
    }


@router.get("/cache", response={200: CacheOut}, auth=NEEDS_VIEWER)
def cache_report(request: HttpRequest) -> dict:
    """Every namespace's entries, rules, lookups, hits, savings and false-hit reports, and
    the newest 50 reports."""
    rows, reports = service.report()
    return {
        "namespaces": [_namespace_out(row) for row in rows],
        "false_hits": [
            {**report.__dict__, "at": datetime.fromtimestamp(report.at, UTC)} for report in reports
        ],
    }


class NamespaceIn(Schema):
    model_config = FORBID_EXTRA

    enabled: bool = True
    threshold: float = Field(service.DEFAULT_THRESHOLD, ge=0.5, le=1.0)
    ttl_s: int = Field(service.DEFAULT_TTL_S, ge=1, le=30 * 24 * 3600)
    max_entries: int = Field(service.DEFAULT_MAX_ENTRIES, ge=10, le=1_000_000)


@router.put("/cache/namespaces/{path:name}", response={200: NamespaceOut}, auth=NEEDS_OPERATOR)
def namespace_change(request: HttpRequest, name: str, payload: NamespaceIn) -> dict:
    """Create or change a namespace's rules: ``tools:<tool>`` opts a tool in; ``answers:<model>``
    tunes (or, ``enabled: false``, stops) a model's cached answers. 422 for another name."""
    if not NAMESPACE.fullmatch(name):
        raise Invalid(
            "A namespace is 'tools:<tool>' (the tool's name: 1 to 64 letters, digits, '_.-') or"
            " 'answers:<model>' (letters, digits, '_.:/-').",
            field="name",
        )
    service.namespace_save(name, **payload.dict())
    audit_record(
        action="cache.namespace",
        target=name,
        changes=[f"{k}={v}" for k, v in payload.dict().items()],
    )
    rows, _ = service.report()
    return _namespace_out(next(row for row in rows if row.name == name))


class InvalidateIn(Schema):
    model_config = FORBID_EXTRA

    namespace: str = Field(
        max_length=200,
        description="a namespace or its start ('tools:', 'answers:m'); '' for all (said, never assumed)",
    )
    older_than_s: float | None = Field(None, ge=0, description="only entries older than this")


class InvalidateOut(Schema):
    removed: int


@router.post("/cache/invalidate", response={200: InvalidateOut}, auth=NEEDS_OPERATOR)
def cache_invalidate(request: HttpRequest, payload: InvalidateIn) -> dict:
    """Remove cached entries by namespace (or its start) and age; every replica stops serving
    them at once."""
    removed = service.invalidate(payload.namespace, payload.older_than_s, why="operator")
    audit_record(
        action="cache.invalidate",
        target=payload.namespace or "*",
        changes=[f"older_than_s={payload.older_than_s}", f"removed={removed}"],
    )
    return {"removed": removed}
