"""``manage.py upgrade``: the same services as the REST API, the last line one JSON object, a
refusal a ``CommandError`` that names what is wrong."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from inference.models import Upgrade
from tests.inference.upgrades.fakes import run_to_end

pytestmark = pytest.mark.django_db


def upgrade(*args: str) -> dict:
    out, err = io.StringIO(), io.StringIO()
    call_command("upgrade", *args, stdout=out, stderr=err)
    return json.loads(out.getvalue().strip().splitlines()[-1])


def test_it_starts_steers_and_shows_an_upgrade(fleet, packages):
    old, new = packages
    started = upgrade("start", old.key, new.key, "--bake-s", "0", "--max-unavailable", "2")
    assert (started["state"], started["settings"]["max_unavailable"]) == ("pending", 2)
    pk = str(started["id"])
    assert upgrade("pause", pk)["state"] == "paused"
    with pytest.raises(CommandError, match=f"Upgrade {pk} is paused; it cannot pause now"):
        upgrade("pause", pk)
    assert upgrade("resume", pk)["state"] == "pending"
    assert upgrade("promote", pk)["promote"] is True
    assert run_to_end(Upgrade.objects.get(pk=pk)).state == "succeeded"
    assert upgrade("show", pk)["state"] == "succeeded"
    assert [u["id"] for u in upgrade("list")] == [started["id"]]


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ("threads=100000", "node_settings.threads: a whole number from 1 to 256"),
        ("sequences=999", "node_settings.sequences: a whole number from 1 to 256"),
        ("ctx_per_seq=1048576", "node_settings.ctx_per_seq: a whole number from 256 to 2048"),
        ("host_ram_mib=9999999", "node_settings.host_ram_mib: a whole number from 1 to 1048576"),
        ("threads=two", "--node-setting 'threads=two': KEY=N with N a whole number"),
    ],
)
def test_a_node_setting_out_of_bounds_is_refused_naming_it(fleet, packages, setting, says):
    old, _ = packages
    with pytest.raises(CommandError, match=f"^{says}"):
        upgrade("start", old.key, old.key, "--node-setting", setting)
    assert not Upgrade.objects.exists()


def test_a_settings_only_roll_from_the_command(fleet, packages):
    old, _ = packages
    started = upgrade(
        "start",
        old.key,
        old.key,
        "--node-setting",
        "threads=2",
        "--bake-s",
        "0",
        "--no-traffic",
        "proceed",
    )
    assert (
        started["node_settings"] == {"threads": 2}
        and started["settings"]["no_traffic"] == "proceed"
    )
    assert run_to_end(Upgrade.objects.get(pk=started["id"])).state == "succeeded"
    assert {(n, s["threads"]) for n, s in fleet.settings.items()} == {
        ("n1", 2),
        ("n2", 2),
        ("n3", 2),
    }
