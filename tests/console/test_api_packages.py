"""The packages REST API: uploads through the production ASGI stack, jobs, approval, and the
409 a rejected version gets when a node is given it."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from inference.models import ModelPackage, PackageJob
from inference.packages import services
from tests.support.processes import bundled_model_path

UPLOAD = "/api/packages/upload"


@pytest.fixture
def home(settings, tmp_path):
    settings.VAR_DIR = tmp_path / "home"
    return settings.VAR_DIR


async def upload(
    data: bytes, query: str, token: str, *, declared: int | None = None, chunk=1 << 20
):
    """POST ``data`` as the raw body, in ``chunk``-sized ASGI messages, to the production app."""
    from console.asgi import application

    pieces = [data[i : i + chunk] for i in range(0, len(data), chunk)] or [b""]
    messages = [
        {"type": "http.request", "body": p, "more_body": i < len(pieces) - 1}
        for i, p in enumerate(pieces)
    ]
    started: dict = {}
    body: list[bytes] = []

    async def receive():
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()  # the client stays connected until the answer is sent

    async def send(message):
        if message["type"] == "http.response.start":
            started.update(message)
        elif message["type"] == "http.response.body":
            body.append(message.get("body", b""))

    length = [] if declared == -1 else [(b"content-length", str(declared or len(data)).encode())]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": UPLOAD,
        "raw_path": UPLOAD.encode(),
        "query_string": query.encode(),
        "headers": [
            (b"host", b"testserver"),
            (b"authorization", f"Bearer {token}".encode()),
            (b"content-type", b"application/octet-stream"),
            *length,
        ],
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
    }
    await asyncio.wait_for(application(scope, receive, send), timeout=120)
    import json

    return started.get("status"), json.loads(b"".join(body) or b"{}")


@pytest.mark.django_db(transaction=True)
async def test_an_upload_that_is_not_gguf_is_a_400_naming_the_problem(home, tokens):
    status, body = await upload(
        b"<html>not a model</html>", "name=m&filename=model.gguf", tokens["admin"]
    )
    assert status == 400 and body["code"] == "not_gguf"
    assert body["detail"] == (
        "model.gguf is not a GGUF file: it starts with b'<htm', a GGUF file starts with b'GGUF'."
    )
    assert not await asyncio.to_thread(ModelPackage.objects.exists)


@pytest.mark.django_db(transaction=True)
async def test_an_upload_must_declare_its_length_within_the_limit(home, tokens):
    status, body = await upload(b"GGUF", "name=m", tokens["admin"], declared=-1)
    assert status == 411 and body["detail"] == "An upload must declare its Content-Length."
    status, body = await upload(b"GGUF", "name=m", tokens["admin"], declared=1 << 40)
    assert status == 413 and "over the limit of 17,179,869,184 bytes" in body["detail"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.model
async def test_it_streams_an_uploaded_gguf_into_the_store_and_checks_its_sha256(home, tokens):
    data = bundled_model_path().read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    bad, body = await upload(data, f"name=up&sha256={'0' * 64}", tokens["admin"])
    assert bad == 400 and "the file changed on the way" in body["detail"]
    assert not list((home / "packages" / "sha256").glob("*/*.gguf"))
    status, body = await upload(
        data, f"name=up&sha256={digest}&filename=smol.gguf", tokens["admin"]
    )
    assert status == 201 and body["key"] == "up:1" and body["sha256"] == digest
    assert body["lineage"] == {"kind": "import", "from": "upload smol.gguf", "template": "gguf"}
    again, _ = await upload(data, "name=up&version=1", tokens["admin"])
    assert again == 200
    forbidden, _ = await upload(data[:64], "name=up2", tokens["operator"])
    assert forbidden == 403


@pytest.fixture
def rejected(db, home) -> ModelPackage:
    package = ModelPackage.objects.create(
        name="m", version="1", gguf_path="/x", sha256="0" * 64, family="m"
    )
    report = {"smoke": {"passed": False, "error": "chat template does not load: boom"}}
    services.package_record_evaluation(package_id=package.pk, report=report)
    package.refresh_from_db()
    return package


def test_a_node_cannot_be_given_a_rejected_version(api, node, rejected):
    response = api("admin", "patch", "/nodes/node-01", {"package_id": rejected.pk})
    assert response.status_code == 409 and response.json()["code"] == "package_rejected"
    assert response.json()["detail"] == (
        "m:1 is rejected (failed: smoke test failed: chat template does not load: boom); it "
        "cannot be deployed."
    )
    assert api("admin", "patch", "/nodes/node-01", {"weight": 2}).status_code == 200


def test_approval_over_a_failed_gate_needs_a_reason_that_is_recorded(api, rejected):
    refused = api("admin", "post", f"/packages/{rejected.pk}/approve", {})
    assert refused.status_code == 409 and refused.json()["code"] == "gate_not_passed"
    assert (
        api(
            "operator", "post", f"/packages/{rejected.pk}/approve", {"override_reason": "x"}
        ).status_code
        == 403
    )
    done = api(
        "admin", "post", f"/packages/{rejected.pk}/approve", {"override_reason": "rollback drill"}
    )
    assert done.status_code == 200 and done.json()["status"] == "approved"
    assert done.json()["status_reason"] == "override: rollback drill"
    audit = api("admin", "get", "/audit").json()
    assert any(
        e["action"] == "package.approved" and "reason: override: rollback drill" in e["changes"]
        for e in audit
    )


def test_jobs_are_queued_shown_and_cancelled(api, package, home):
    bad = api("operator", "post", f"/packages/{package.pk}/quantize", {"quantization": "Q9"})
    assert bad.status_code == 422 and bad.json()["field"] == "quantization"
    assert (
        api(
            "viewer", "post", f"/packages/{package.pk}/quantize", {"quantization": "Q8_0"}
        ).status_code
        == 403
    )
    queued = api("operator", "post", f"/packages/{package.pk}/quantize", {"quantization": "q8_0"})
    assert queued.status_code == 202 and queued.json()["state"] == "queued"
    job_id = queued.json()["id"]
    assert (
        api("viewer", "get", f"/packages/jobs/{job_id}").json()["params"]["quantization"] == "Q8_0"
    )
    cancelled = api("operator", "post", f"/packages/jobs/{job_id}/cancel")
    assert cancelled.json()["state"] == "cancelled"
    again = api("operator", "post", f"/packages/jobs/{job_id}/cancel")
    assert again.status_code == 409 and again.json()["code"] == "job_finished"
    assert PackageJob.objects.get(pk=job_id).finished_at is not None
    evaluation = api("operator", "post", f"/packages/{package.pk}/evaluate", {"subset": 4})
    assert evaluation.status_code == 202 and evaluation.json()["kind"] == "evaluate"
    twice = api("operator", "post", f"/packages/{package.pk}/evaluate", {})
    assert twice.status_code == 409 and "being evaluated already" in twice.json()["detail"]


def test_a_family_gate_can_be_set(api):
    assert api("viewer", "get", "/packages/policies/smollm2").json()["min_tool_accuracy"] == 0.5
    bad = api("admin", "put", "/packages/policies/smollm2", {"min_tool_accuracy": 1.5})
    assert bad.status_code == 422 and bad.json()["field"] == "min_tool_accuracy"
    ok = api("admin", "put", "/packages/policies/smollm2", {"min_tool_accuracy": 0.3})
    assert ok.json()["min_tool_accuracy"] == 0.3 and ok.json()["max_regression"] == 0.05
