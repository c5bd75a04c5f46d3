"""A package version's name: the naming rules, the next version number of a name, and
whether ``name:version`` is still free.

Errors (``console.lib.errors``): ``Invalid`` (a field, 422), ``Conflict`` (the version
exists, 409).
"""

from __future__ import annotations

import re

from console.lib.errors import Conflict, Invalid
from inference.models import ModelPackage

VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def next_version(name: str) -> str:
    """``"1"`` for a new name, else one more than the highest numeric version."""
    numbers = [
        int(v)
        for v in ModelPackage.objects.filter(name=name).values_list("version", flat=True)
        if re.fullmatch(r"[0-9]{1,18}", v)
    ]
    return str(max(numbers, default=0) + 1)


def check_name(name: str, version: str) -> None:
    """Raise ``Invalid`` naming the field when ``name`` or ``version`` breaks the rules."""
    if not VERSION.fullmatch(version):
        raise Invalid(
            "version: letters, digits, '.', '_' and '-' (at most 64), starting with a letter "
            "or digit.",
            field="version",
        )
    probe = ModelPackage(name=name, version=version, gguf_path="x", sha256="0" * 64)
    from django.core.exceptions import ValidationError

    try:
        probe.full_clean(validate_unique=False, validate_constraints=False)
    except ValidationError as exc:
        field, messages = next(iter(exc.message_dict.items()))
        raise Invalid(f"{field}: {messages[0]}", field=field) from exc


def check_version_free(name: str, version: str | None) -> None:
    """Raise ``Conflict`` now, rather than when a job ends, if ``name:version`` exists."""
    if version and ModelPackage.objects.filter(name=name, version=version).exists():
        raise Conflict(
            f"{name}:{version} exists; a new file is a new version.",
            code="package_conflict",
            field="version",
        )
