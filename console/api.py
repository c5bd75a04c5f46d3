"""The project's one NinjaAPI (``/api/``, OpenAPI docs at ``/api/docs``).

Each app adds its own ``Router`` from its ``api.py``; domain errors are mapped to HTTP here.
Authentication and roles live in ``console/lib/access.py``: every operation needs a Bearer token or
a logged-in user (CSRF-checked), with the role its ``auth=`` names (``NEEDS_VIEWER`` ...),
checked before the body is validated. The OpenAPI schema and docs take a token or a login.

Error bodies: ``{"detail": message, "code": code, "field": field}`` (config errors add
``line``); 401 without credentials, 403 for a role too weak.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError
from ninja.errors import ValidationError as NinjaValidationError
from ninja.parser import Parser

from console.config_file import ConfigError
from console.lib.access import API_AUTH, token_or_login
from console.lib.errors import ConsoleError
from console.services import invalid_from
from inference.chat_request import decode_json
from inference.errors import BadRequest


class StrictJsonParser(Parser):
    """Request bodies decoded as the proxy decodes them (``decode_json``): NaN, Infinity,
    unpaired surrogates and nesting past Python's limit are a 400, not a 500 later."""

    def parse_body(self, request: HttpRequest) -> Any:
        return decode_json(request.body)


class PhalanxApi(NinjaAPI):
    """The NinjaAPI whose OpenAPI ``operationId`` is the operation's function name
    (``nodes_list``, ``package_get``): stable when a router moves to another module (ninja's
    default prefixes the module path). Names are unique across routers (a test checks)."""

    def get_openapi_operation_id(self, operation: Any) -> str:
        return str(operation.view_func.__name__)


api = PhalanxApi(
    title="Phalanx admin API",
    parser=StrictJsonParser(),
    version="1",
    urls_namespace="api",
    auth=API_AUTH,
    description="Nodes, packages, tokens, config, routing. Bearer token or console login.",
    docs_decorator=token_or_login,
)


@api.exception_handler(ConsoleError)
def _console_error(request: HttpRequest, exc: ConsoleError) -> HttpResponse:
    return api.create_response(
        request, {"detail": exc.message, "code": exc.code, "field": exc.field}, status=exc.status
    )


@api.exception_handler(BadRequest)
def _bad_body(request: HttpRequest, exc: BadRequest) -> HttpResponse:
    return api.create_response(
        request, {"detail": exc.message, "code": exc.code, "field": exc.param}, status=400
    )


@api.exception_handler(ConfigError)
def _config_error(request: HttpRequest, exc: ConfigError) -> HttpResponse:
    body = {"detail": str(exc), "code": "invalid_config", "line": exc.line, "field": exc.field}
    return api.create_response(request, body, status=422)


@api.exception_handler(ValidationError)
def _django_validation(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    return _console_error(request, invalid_from(exc))


@api.exception_handler(AuthenticationError)
def _unauthenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    body = {
        "detail": "Send 'Authorization: Bearer <token>' or log in.",
        "code": "unauthorized",
        "field": None,
    }
    response = api.create_response(request, body, status=401)
    response["WWW-Authenticate"] = "Bearer"
    return response


@api.exception_handler(NinjaValidationError)
def _bad_input(request: HttpRequest, exc: NinjaValidationError) -> HttpResponse:
    first = exc.errors[0] if exc.errors else {}
    loc = [str(p) for p in first.get("loc", []) if p not in ("body", "payload", "query", "path")]
    field = ".".join(loc) or None
    message = f"{field}: {first.get('msg', 'invalid')}" if field else first.get("msg", "invalid")
    body = {"detail": message, "code": "invalid", "field": field, "errors": exc.errors}
    return api.create_response(request, body, status=422)


from console.api_config import router as config_router  # noqa: E402
from console.api_logs import router as logs_router  # noqa: E402
from inference.alerts.api import router as alerts_router  # noqa: E402
from inference.api import router as inference_router  # noqa: E402
from inference.loadtests.api import router as loadtests_router  # noqa: E402
from inference.packages.api import router as packages_router  # noqa: E402
from inference.prefixes.api import router as prefixes_router  # noqa: E402
from inference.semcache.api import router as cache_router  # noqa: E402
from inference.token_api import router as tokens_router  # noqa: E402
from inference.upgrades.api import router as upgrades_router  # noqa: E402
from inference.usage.api import router as usage_router  # noqa: E402
from inference.usage.quota_api import router as quotas_router  # noqa: E402
from nodes.api import router as nodes_router  # noqa: E402
from nodes.api_validation import router as validation_router  # noqa: E402

api.add_router("/", nodes_router)
api.add_router("/", packages_router)
api.add_router("/", tokens_router)
api.add_router("/", upgrades_router)
api.add_router("/", loadtests_router)
api.add_router("/", validation_router)
api.add_router("/", config_router)
api.add_router("/", alerts_router)
api.add_router("/", logs_router)
api.add_router("/", cache_router)
api.add_router("/", prefixes_router)
api.add_router("/", quotas_router)
api.add_router("/", usage_router)
api.add_router("/", inference_router)  # /api/sessions, /api/routing/policy
