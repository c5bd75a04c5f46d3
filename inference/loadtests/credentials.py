"""The API tokens a load-test run mints for itself, recorded on its row and revoked with it.

A run with no token of its own gets a viewer token from its worker (``jobs.Worker``), minted
only once the target proved it is this control plane (``identity``). Each token's id is written
to the run's ``minted_tokens`` in the same transaction that creates it, and only while the
attempt still holds the run, so no token exists that the row does not name. Whoever ends the
run (its worker, a stop of a queued run), queues it again after its worker died, or gives up on
it (the control loop, ``jobs._worker_gone``) calls ``run_tokens_revoke``: a secret minted for a
job dies with the job, and an attempt that lost its claim can no longer load the array.
"""

from __future__ import annotations

from django.db import transaction

from inference.loadtests.models import LoadTestRun


class ClaimLost(Exception):
    """The attempt no longer holds its run (it was given up on): it must not mint."""


def run_token_mint(run_id: int, *, rows) -> str:
    """Mint a viewer API token for run ``run_id`` and record its id on the row; ``rows``: the
    attempt's queryset of the row (``console.lib.jobs.Lease.rows()``). Returns the plaintext. Raises
    ``ClaimLost`` (and creates nothing) when ``rows`` no longer matches."""
    from console.models import Role
    from inference.tokens import token_issue

    with transaction.atomic():
        held = rows.select_for_update().values_list("minted_tokens", flat=True).first()
        if held is None:
            raise ClaimLost(f"load test {run_id}: this attempt no longer holds the run")
        minted, plaintext = token_issue(name=f"load test {run_id}", role=Role.VIEWER)
        if not rows.update(minted_tokens=[*held, minted.pk]):
            raise ClaimLost(f"load test {run_id}: this attempt no longer holds the run")
    return plaintext


def run_tokens_revoke(run_id: int) -> int:
    """Revoke every token minted for run ``run_id`` (idempotent); returns how many were still
    valid. Other processes refuse a revoked token within ``inference.lookups.TTL_S``."""
    from inference.models import ApiToken
    from inference.tokens import token_revoke

    ids = LoadTestRun.objects.filter(pk=run_id).values_list("minted_tokens", flat=True).first()
    live = list(
        ApiToken.objects.filter(pk__in=ids or [], revoked=False).values_list("pk", flat=True)
    )
    for token_id in live:
        token_revoke(token_id=token_id)
    return len(live)
