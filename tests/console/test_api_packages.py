"""The packages REST API: uploads through the production ASGI stack, jobs, approval, and the
409 a rejected version gets when a node is given it."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from inference.models import ModelPackage, PackageJob
from inference.packages import services
from tests.support.processes import bundled_model_path

UPLOADS = "/api/packages/uploads"


@pytest.fixture
def home(settings, tmp_path):
    settings.VAR_DIR = tmp_path / "home"
    return settings.VAR_DIR


async def asgi(
    method: str, path: str, token: str, body: bytes = b"", *, query: str = "", json_body=None
):
    """One request through the production ASGI app (``console.asgi``: the body limit, then
    Django), the body sent in 1 MiB messages; returns (status, JSON answer)."""
    import json

    from console.asgi import application

    content_type = b"application/octet-stream"
    if json_body is not None:
        body, content_type = json.dumps(json_body).encode(), b"application/json"
    pieces = [body[i : i + (1 << 20)] for i in range(0, len(body), 1 << 20)] or [b""]
    messages = [
        {"type": "http.request", "body": p, "more_body": i < len(pieces) - 1}
        for i, p in enumerate(pieces)
    ]
    started: dict = {}
    answer: list[bytes] = []

    async def receive():
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()  # the client stays connected until the answer is sent

    async def send(message):
        if message["type"] == "http.response.start":
            started.update(message)
        elif message["type"] == "http.response.body":
            answer.append(message.get("body", b""))

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "headers": [
            (b"host", b"testserver"),
            (b"authorization", f"Bearer {token}".encode()),
            (b"content-type", content_type),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
    }
    await asyncio.wait_for(application(scope, receive, send), timeout=120)
    return started.get("status"), json.loads(b"".join(answer) or b"{}")


async def upload(data: bytes, token: str, **meta):
    """The whole parts protocol: announce, PUT parts of ``part_bytes``, finish."""
    status, begun = await asgi("POST", UPLOADS, token, json_body={"size": len(data), **meta})
    if status != 201:
        return status, begun
    step = begun["part_bytes"]
    for offset in range(0, len(data), step):
        status, body = await asgi(
            "PUT",
            f"{UPLOADS}/{begun['id']}",
            token,
            data[offset : offset + step],
            query=f"offset={offset}",
        )
        if status != 200:
            return status, body
    return await asgi("POST", f"{UPLOADS}/{begun['id']}/finish", token)


@pytest.mark.django_db(transaction=True)
async def test_an_upload_that_is_not_gguf_is_a_400_naming_the_problem(home, tokens):
    status, body = await upload(
        b"<html>not a model</html>", tokens["admin"], name="m", filename="model.gguf"
    )
    assert status == 400 and body["code"] == "not_gguf"
    assert body["detail"] == (
        "model.gguf is not a GGUF file: it starts with b'<htm', a GGUF file starts with b'GGUF'."
    )
    assert not await asyncio.to_thread(ModelPackage.objects.exists)
    assert not list((home / "packages" / "incoming" / "uploads").iterdir())  # dropped


@pytest.mark.django_db(transaction=True)
async def test_an_upload_is_announced_within_the_limit_and_sent_in_bounded_parts(home, tokens):
    too_big = {"name": "m", "size": 1 << 40}
    status, body = await asgi("POST", UPLOADS, tokens["admin"], json_body=too_big)
    assert status == 422 and body["field"] == "size"
    assert "between 1 and 17,179,869,184 bytes" in body["detail"]
    status, begun = await asgi(
        "POST", UPLOADS, tokens["admin"], json_body={"name": "m", "size": 9 << 20}
    )
    assert status == 201 and begun["part_bytes"] == 8 << 20 and begun["received"] == 0
    # a part over the request body limit never reaches the application (daphne would hold it)
    part = f"{UPLOADS}/{begun['id']}"
    status, body = await asgi(
        "PUT", part, tokens["admin"], b"GGUF" + bytes(8 << 20), query="offset=0"
    )
    assert status == 413 and body["code"] == "body_too_large"
    status, body = await asgi("PUT", part, tokens["operator"], b"GGUF", query="offset=0")
    assert status == 403
    status, body = await asgi("PUT", part, tokens["admin"], b"GGUF" + bytes(100), query="offset=0")
    assert status == 200 and body["received"] == 104
    status, body = await asgi("PUT", part, tokens["admin"], bytes(10), query="offset=50")
    assert status == 409 and body["detail"] == (
        "offset: this upload has 104 bytes; send the part that starts there."
    )
    status, body = await asgi("POST", f"{part}/finish", tokens["admin"])
    assert status == 409 and body["detail"] == (
        "104 of 9,437,184 bytes arrived; send the rest first."
    )
    assert (await asgi("GET", part, tokens["admin"]))[1]["received"] == 104
    assert (await asgi("DELETE", part, tokens["admin"]))[0] == 204
    assert (await asgi("GET", part, tokens["admin"]))[0] == 404


@pytest.mark.django_db(transaction=True)
@pytest.mark.model
async def test_an_uploaded_gguf_is_stored_in_parts_and_its_sha256_checked(home, tokens):
    data = bundled_model_path().read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    bad, body = await upload(data, tokens["admin"], name="up", sha256="0" * 64)
    assert bad == 400 and "the file changed on the way" in body["detail"]
    assert not list((home / "packages" / "sha256").glob("*/*.gguf"))
    status, body = await upload(
        data, tokens["admin"], name="up", sha256=digest, filename="smol.gguf"
    )
    assert status == 201 and body["key"] == "up:1" and body["sha256"] == digest
    assert body["lineage"] == {"kind": "import", "from": "upload smol.gguf", "template": "gguf"}
    again, _ = await upload(data, tokens["admin"], name="up", version="1", sha256=digest)
    assert again == 200
    same, _ = await upload(data, tokens["admin"], name="up", version="1")  # no sha256 given
    assert same == 200
    other = data[:-1] + bytes([data[-1] ^ 1])  # one bit of the last tensor
    taken, body = await upload(other, tokens["admin"], name="up", version="1")
    assert taken == 409 and body["detail"].startswith("up:1 exists with another file")
    assert len(list((home / "packages" / "sha256").glob("*/*.gguf"))) == 1  # nothing kept
    forbidden, _ = await upload(data[:64], tokens["operator"], name="up2")
    assert forbidden == 403
    assert not list((home / "packages" / "incoming" / "uploads").iterdir())


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


def test_a_finished_job_names_the_version_it_made(api, package):
    made = ModelPackage.objects.create(
        name=package.name, version="2", gguf_path="/nonexistent/y.gguf", sha256="1" * 64
    )
    job = PackageJob.objects.create(kind="build", package=package, state="succeeded", output=made)
    answer = api("viewer", "get", f"/packages/jobs/{job.pk}").json()
    assert (answer["output_id"], answer["output_key"]) == (made.pk, f"{package.name}:2")


def test_a_family_gate_can_be_set(api):
    assert api("viewer", "get", "/packages/policies/smollm2").json()["min_tool_accuracy"] == 0.5
    bad = api("admin", "put", "/packages/policies/smollm2", {"min_tool_accuracy": 1.5})
    assert bad.status_code == 422 and bad.json()["field"] == "min_tool_accuracy"
    ok = api("admin", "put", "/packages/policies/smollm2", {"min_tool_accuracy": 0.3})
    assert ok.json()["min_tool_accuracy"] == 0.3 and ok.json()["max_regression"] == 0.05
