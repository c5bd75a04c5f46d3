"""``{{ value|money }}``: an amount as people read it, to six significant figures and never
in exponent notation (a turn costs millionths: ``0.0000466``, not ``4.66e-05``); an em dash
for none."""

from __future__ import annotations

from decimal import Decimal

from django import template

register = template.Library()


def money_text(value: float) -> str:
    """``value`` to six significant figures, written out in full (``0.0000466``, ``1234.57``)."""
    return format(Decimal(f"{value:.6g}"), "f")


@register.filter
def money(value: float | None, empty: str = "—") -> str:
    """``money_text`` of ``value``; ``empty`` when there is none."""
    return empty if value is None else money_text(float(value))
