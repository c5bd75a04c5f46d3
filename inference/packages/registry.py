"""Where a stored file becomes a version: the ``ModelPackage`` row, made once per
``name:version`` (the unique pair decides a race), audited. Callers hold the file
(``retention.unless_registered``) until the row is committed."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction

from console.lib.audit import audit_record
from console.lib.errors import Conflict, ConsoleError, Invalid
from inference.models import ModelPackage
from inference.packages.store import Stored

DEFAULT_SAMPLING = {"temperature": 0.8, "top_p": 0.95}  # the node's defaults (engine/sampling)
# A chat template's UTF-8 bytes, at most: the longest in common use (tool-use templates of
# Llama 3.x, Qwen, Hermes) are 5 to 20 KiB; pages diff two of them line by line.
CHAT_TEMPLATE_MAX_BYTES = 64 << 10


class BadFile(ConsoleError):
    """The file is not a GGUF (or not a readable one): 400 with the reason."""

    status = 400
    code = "not_gguf"


def check_chat_template(text: str, *, field: str = "chat_template") -> None:
    """Raise ``Invalid`` (422, naming ``field`` and the limit) when ``text`` is over
    ``CHAT_TEMPLATE_MAX_BYTES`` of UTF-8."""
    size = len(text.encode("utf-8", "replace"))
    if size > CHAT_TEMPLATE_MAX_BYTES:
        raise Invalid(
            f"{field}: {size:,} bytes, over the limit of {CHAT_TEMPLATE_MAX_BYTES:,} bytes.",
            field=field,
        )


def _check_facts(facts: Any) -> None:
    """Raise ``BadFile`` (400) when what the GGUF says of itself does not fit a row: a chat
    template over the limit, an architecture or file type longer than its column."""
    size = len(facts.chat_template.encode("utf-8", "replace"))
    if size > CHAT_TEMPLATE_MAX_BYTES:
        raise BadFile(
            f"the GGUF's chat template is {size:,} bytes, over the limit of "
            f"{CHAT_TEMPLATE_MAX_BYTES:,}."
        )
    for what, value, limit in (
        ("architecture", facts.architecture, ModelPackage._meta.get_field("architecture")),
        ("file type", facts.quantization, ModelPackage._meta.get_field("quantization")),
    ):
        if len(value) > limit.max_length:
            raise BadFile(
                f"the GGUF's {what} is {len(value):,} characters, over the limit of "
                f"{limit.max_length}."
            )


def stored_fields(stored: Stored) -> dict[str, Any]:
    """The row fields that name the stored file."""
    return {
        "stored_path": str(stored.path),
        "sha256": stored.sha256,
        "size_bytes": stored.size_bytes,
    }


@transaction.atomic
def _from_facts(facts: Any) -> dict[str, Any]:
    """The row fields a GGUF's facts give, with the serving settings it starts with."""
    return {
        "quantization": facts.quantization,
        "architecture": facts.architecture,
        "parameters": facts.parameters,
        "context_window": facts.context_length or 2048,
        "chat_template": facts.chat_template,
        "chat_template_sha256": facts.chat_template_sha256,
        "tensor_types": facts.tensor_types,
        "ctx_per_seq": min(2048, facts.context_length or 2048),
        "sequences": 8,
        "sampling": dict(DEFAULT_SAMPLING),
    }


def register(
    *,
    name: str,
    version: str,
    family: str,
    stored_path: str,
    sha256: str,
    size_bytes: int,
    facts: Any,
    template_source: str,
    lineage: dict[str, Any],
    parent: ModelPackage | None,
    build_report: dict[str, Any] | None = None,
) -> tuple[ModelPackage, bool]:
    """The draft row ``name:version`` for ``sha256``'s stored file, and whether it is new;
    the existing row when it has the same file. Raises ``Conflict`` (409) when
    ``name:version`` exists, or was registered meanwhile, with another file."""
    _check_facts(facts)
    existing = ModelPackage.objects.filter(name=name, version=version).first()
    if existing is not None:
        if existing.sha256 != sha256:
            raise Conflict(
                f"{existing.key} exists with another file (sha256 {existing.sha256[:12]}…); "
                "a change is a new version.",
                code="package_conflict",
                field="version",
            )
        return existing, False
    try:
        with transaction.atomic():  # a savepoint: the unique (name, version) may refuse it
            package = ModelPackage.objects.create(
                name=name,
                version=version,
                family=family,
                gguf_path=stored_path,
                sha256=sha256,
                size_bytes=size_bytes,
                **_from_facts(facts),
                template_source=template_source,
                lineage=lineage,
                parent=parent,
                build_report=build_report,
            )
    except IntegrityError as exc:  # the same name:version, registered a moment ago
        raise Conflict(
            f"{name}:{version} was registered meanwhile; a new file is a new version.",
            code="package_conflict",
            field="version",
        ) from exc
    audit_record(
        action="package.create",
        target=package.key,
        changes=[f"{k}: {v}" for k, v in lineage.items()] + [f"sha256: {sha256}"],
    )
    return package, True
