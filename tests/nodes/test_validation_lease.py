"""A validation run another control loop holds (``lease_until``, ``console.lib.jobs.hold``) is
neither started nor polled here until that lease runs out; a step clears its own lease."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from nodes import device_validation as dv
from nodes.models import Node, ValidationRun

pytestmark = pytest.mark.django_db


def test_a_held_run_is_left_to_its_holder_until_the_lease_runs_out(monkeypatch):
    node = Node.objects.create(node_id="node-01", address="127.0.0.1:1")
    run = ValidationRun.objects.create(
        node=node, trigger="demand", lease_until=timezone.now() + timedelta(seconds=30)
    )
    started = []
    monkeypatch.setattr(dv, "validation_start", lambda r: started.append(r.pk) or True)
    assert dv.validation_due() == [run.pk]
    dv.validation_step()
    assert started == []  # another loop holds it
    ValidationRun.objects.filter(pk=run.pk).update(
        lease_until=timezone.now() - timedelta(seconds=1)
    )
    dv.validation_step()
    assert started == [run.pk]
    assert ValidationRun.objects.get(pk=run.pk).lease_until is None  # released after the step
