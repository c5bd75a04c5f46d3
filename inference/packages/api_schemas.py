"""The request and response schemas of the packages API (``inference/packages/api.py``):
``...In`` bodies, ``...Out`` answers, with the units and choices their fields take."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ninja import Field, Schema


class PackageOut(Schema):
    id: int
    kind: str = Field(
        "chat",
        description="chat (a GGUF nodes serve) or embedding (a directory of model files the "
        "control plane runs for /v1/embeddings and the semantic cache)",
    )
    key: str = Field(description="name:version")
    name: str
    version: str
    gguf_path: str = Field(description="the GGUF file; an embedding package's files directory")
    sha256: str
    quantization: str
    architecture: str
    context_window: int
    created_at: datetime
    nodes: int = Field(0, description="nodes serving it")
    up: int = Field(
        0, description="of those, taking traffic (up, validated, weight > 0: as /v1/models counts)"
    )
    family: str = ""
    status: str = Field("draft", description="draft, evaluating, approved, rejected, retired")
    status_reason: str = ""
    size_bytes: int | None = None
    parameters: int | None = None
    template_source: str = Field("gguf", description="gguf, operator, none (completion-only)")
    chat_template_sha256: str = ""
    parent_id: int | None = None
    lineage: dict[str, Any] = {}
    tool_accuracy: float | None = Field(None, description="grammar mode, 0..1")
    gate: str | None = Field(None, description="the gate's summary, when evaluated")
    warnings: list[str] = Field([], description="for the operator, after an import")


class GgufOut(Schema):
    exists: bool
    size_bytes: int | None
    architecture: str
    parameters: int | None
    quantization: str
    context_length: int | None
    chat_template: str
    tensors: int | None
    name: str
    error: str


class PackageDetailOut(PackageOut):
    chat_template: str
    gguf: GgufOut
    tensor_types: dict[str, int] = {}
    ctx_per_seq: int
    sequences: int
    sampling: dict[str, Any] = {}
    build_report: dict[str, Any] | None = None
    evaluation: dict[str, Any] | None = None
    gate_result: dict[str, Any] | None = None


class JobOut(Schema):
    id: int
    kind: str
    state: str
    package_id: int | None
    output_id: int | None
    output_key: str | None = Field(None, description="name:version of the package it made")
    params: dict[str, Any]
    progress: float = Field(description="0..1")
    cancel_requested: bool = False
    message: str
    error: str
    result: Any = None
    log: str = ""
    created_by: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class ImportIn(Schema):
    name: str
    version: str | None = None
    path: str = Field("", description="a GGUF file on the control plane's host")
    requirement: str = Field("", description="a Python package shipping a GGUF: name[==version]")
    chat_template: str | None = Field(None, description="for a GGUF without one (Jinja)")


class UploadIn(Schema):
    name: str
    version: str | None = None
    size: int = Field(description="the whole file, bytes")
    sha256: str = Field("", description="the whole file's, hex; checked when the upload ends")
    filename: str = ""


class UploadOut(Schema):
    id: str
    name: str
    version: str
    size: int
    received: int = Field(description="bytes stored so far: the offset of the next part")
    part_bytes: int = Field(description="the largest part one request may carry")


class QuantizeIn(Schema):
    quantization: str = Field(
        description="Q8_0, Q6_K, Q5_K_M, Q5_1, Q5_0, Q4_K_M, Q4_1, Q4_0, Q3_K_M, Q2_K"
    )
    method: str = Field("f16", description="f16 (dequantize first) or requantize")
    name: str | None = None
    version: str | None = None


class EvaluateIn(Schema):
    subset: int | None = Field(None, description="number of cases (default: the whole suite)")


class ApproveIn(Schema):
    override_reason: str = Field("", description="needed when the gate has not passed")


class RejectIn(Schema):
    reason: str


class TemplateIn(Schema):
    chat_template: str
    version: str | None = None


class GatePolicyIn(Schema):
    min_tool_accuracy: float | None = None
    min_schema_valid: float | None = None
    max_regression: float | None = None
    max_perplexity_increase: float | None = None


class GatePolicyOut(Schema):
    family: str
    min_tool_accuracy: float
    min_schema_valid: float
    max_regression: float
    max_perplexity_increase: float


class PackageIn(Schema):
    name: str
    version: str
    gguf_path: str = Field(description="path of the GGUF file on the control plane's host")
