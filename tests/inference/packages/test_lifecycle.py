"""The package lifecycle's services (inference/packages/services.py) on real GGUF files:
import into the content-addressed store, templates, status moves, the gate, deploy checks."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from console import services as console_services
from console.lib.errors import Conflict
from inference.models import ModelPackage
from inference.packages import services
from inference.packages.gguf_files import read_facts
from inference.packages.registry import BadFile
from nodes.models import Node

pytestmark = [pytest.mark.django_db, pytest.mark.model]

GEMMA_TURNS = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>"
    "{{ 'model' if m['role'] == 'assistant' else 'user' }}\n{{ m['content'] }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def imported(path, name="smol", version="1", **kw):
    source = {"kind": "import", "from": f"file {path}"}
    return services.package_import_file(path=path, name=name, version=version, source=source, **kw)


def failing_report(error: str = "") -> dict:
    smoke = {"passed": not error, "error": error, "steps": []}
    modes = {"grammar": {"tool_accuracy": 0.1, "schema_valid_rate": 1.0}}
    return {"smoke": smoke, "modes": {} if error else modes, "perplexity": 30.0}


def test_it_imports_a_gguf_into_the_content_addressed_store(home, bundled):
    first = imported(bundled)
    package = first.package
    assert first.created and first.warnings == []
    assert package.gguf_path == str(
        home / "packages" / "sha256" / package.sha256[:2] / f"{package.sha256}.gguf"
    )
    assert package.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert (package.quantization, package.architecture, package.family) == ("Q4_1", "llama", "smol")
    assert package.status == "draft" and package.template_source == "gguf"
    assert 130e6 < package.parameters < 140e6 and package.tensor_types["Q4_1"] > 100
    assert package.chat_template_sha256 and "im_start" in package.chat_template
    again = imported(bundled)
    assert again.package.pk == package.pk and not again.created


def test_the_same_version_with_another_file_is_a_conflict(home, bundled, bare_gguf):
    imported(bundled)
    with pytest.raises(Conflict, match="smol:1 exists with another file"):
        imported(bare_gguf)  # the same weights, other bytes (no chat template)


def test_a_gguf_without_a_chat_template_says_so_and_is_completion_only(home, bare_gguf):
    base = bare_gguf
    bare = imported(base, name="base-model")
    assert bare.package.template_source == "none" and bare.package.completion_only
    assert "has no chat template" in bare.warnings[0]
    given = imported(base, name="base-model", version="2", chat_template=GEMMA_TURNS)
    assert given.package.template_source == "operator" and given.warnings == []
    assert read_facts(given.package.gguf_path).chat_template == GEMMA_TURNS


def test_a_new_template_is_a_new_version_with_its_lineage(home, bundled):
    source = imported(bundled).package
    derived = services.package_with_template(package_id=source.pk, chat_template=GEMMA_TURNS)
    assert derived.key == "smol:2" and derived.parent == source
    assert derived.lineage == {"kind": "template", "from": "smol:1", "from_id": source.pk}
    assert derived.sha256 != source.sha256 and derived.chat_template == GEMMA_TURNS


def test_it_refuses_a_file_that_is_not_gguf(home, tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04 a zip file")
    with pytest.raises(BadFile, match="not a GGUF file"):
        imported(path)
    assert not ModelPackage.objects.exists()


def test_approving_needs_a_passed_gate_or_a_recorded_override(home, bundled):
    package = imported(bundled).package
    with pytest.raises(
        Conflict,
        match="has not passed the gate .it has not been evaluated.; approving it needs an override reason",
    ):
        services.package_approve(package_id=package.pk)
    approved = services.package_approve(
        package_id=package.pk, override_reason="bundled, proven by hand"
    )
    assert approved.status == "approved"
    assert approved.status_reason == "override: bundled, proven by hand"


def test_an_approved_version_never_changes(home, bundled):
    package = imported(bundled).package
    services.package_approve(package_id=package.pk, override_reason="test")
    package.refresh_from_db()
    package.ctx_per_seq = 4096
    with pytest.raises(ValidationError, match="immutable; cannot change ctx_per_seq"):
        package.save()
    with pytest.raises(Conflict, match="is approved; its evaluation is final"):
        services.package_evaluate_enqueue(package_id=package.pk)
    with pytest.raises(Conflict, match="smol:1 is approved; it cannot become rejected"):
        services.package_reject(package_id=package.pk, reason="late")


def test_a_failed_gate_rejects_the_version_naming_the_criteria(home, bundled):
    package = imported(bundled).package
    result = services.package_record_evaluation(package_id=package.pk, report=failing_report())
    package.refresh_from_db()
    assert not result.passed and package.status == "rejected"
    assert package.status_reason == "failed: tool_accuracy 0.10 < 0.50"
    assert package.gate["criteria"][1] == {
        "name": "tool_accuracy",
        "passed": False,
        "detail": "tool_accuracy 0.10 < 0.50",
        "value": 0.1,
        "limit": 0.5,
    }


def test_a_rejected_or_retired_version_cannot_be_deployed(home, bundled):
    package = imported(bundled).package
    node = Node.objects.create(validation="passed", node_id="n1", address="127.0.0.1:9999")
    services.package_record_evaluation(package_id=package.pk, report=failing_report("boom"))
    with pytest.raises(
        Conflict,
        match=r"smol:1 is rejected \(failed: smoke test failed: boom\); it cannot be deployed",
    ):
        console_services.node_update(node_id=node.node_id, changes={"package_id": package.pk})
    other = imported(bundled, version="2").package  # same bytes, another version
    services.package_retire(package_id=other.pk)
    with pytest.raises(Conflict, match="smol:2 is retired"):
        console_services.node_create(node_id="n2", address="127.0.0.1:9998", package_id=other.pk)


def test_a_version_in_use_cannot_be_retired(home, bundled):
    package = imported(bundled).package
    Node.objects.create(
        validation="passed", node_id="n1", address="127.0.0.1:9999", package=package
    )
    with pytest.raises(Conflict, match="served by nodes"):
        services.package_retire(package_id=package.pk)


def test_it_builds_a_default_name_from_the_family(home, bundled):
    package = imported(bundled, name="smollm2-135m-instruct-q4_1").package
    assert package.family == "smollm2-135m-instruct"
    job = services.package_build_enqueue(package_id=package.pk, quantization="q4_k_m")
    assert job.params == {
        "quantization": "Q4_K_M",
        "method": "f16",
        "name": "smollm2-135m-instruct-q4_k_m",
        "version": None,
    }
    with pytest.raises(Exception, match="'Q1_X' is not one of"):
        services.package_build_enqueue(package_id=package.pk, quantization="Q1_X")


def test_a_version_is_letters_digits_and_dots(home, bundled):
    source = imported(bundled).package
    with pytest.raises(Exception, match="version: letters, digits"):
        services.package_with_template(
            package_id=source.pk, chat_template="{{ messages }}", version="1');alert(1);('"
        )
    with pytest.raises(Exception, match="version: letters, digits"):
        services.package_build_enqueue(package_id=source.pk, quantization="Q8_0", version="²")
