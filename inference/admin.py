from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from console.lib.read_only_admin import ReadOnlyAdmin
from inference.alerts.models import AlertSettings
from inference.models import ApiToken, ModelPackage, RouteDecision, RoutingPolicy, SessionRoute


@admin.register(ModelPackage)
class ModelPackageAdmin(ReadOnlyAdmin):
    list_display = (
        "name",
        "version",
        "quantization",
        "context_window",
        "architecture",
        "created_at",
    )
    search_fields = ("name", "version", "sha256")

    def get_readonly_fields(self, request: HttpRequest, obj: ModelPackage | None = None):
        # Packages are immutable: once saved, every field is read-only.
        if obj is not None:
            return [f.name for f in obj._meta.fields]
        return ("created_at",)


@admin.register(RoutingPolicy)
class RoutingPolicyAdmin(ReadOnlyAdmin):
    list_display = (
        "session_header",
        "health_interval_s",
        "failure_threshold",
        "failover_strategy",
        "request_timeout_s",
    )

    def has_delete_permission(self, request: HttpRequest, obj: RoutingPolicy | None = None) -> bool:
        return False


class RouteDecisionInline(admin.TabularInline):
    model = RouteDecision
    extra = 0
    max_num = 0
    can_delete = False
    readonly_fields = ("created_at", "action", "node_id", "reason")


@admin.register(SessionRoute)
class SessionRouteAdmin(ReadOnlyAdmin):
    list_display = ("session_id", "node", "package", "turns", "moves", "last_seen_at", "created_at")
    list_filter = ("node", "package")
    search_fields = ("session_id",)
    readonly_fields = ("created_at", "last_seen_at")
    inlines = [RouteDecisionInline]


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdmin):
    list_display = ("name", "prefix", "created_by", "created_at", "last_used_at", "revoked")
    list_filter = ("revoked",)
    readonly_fields = ("token_hash", "prefix", "created_by", "created_at", "last_used_at")
    fields = ("name", "revoked", "prefix", "token_hash", "created_by", "created_at", "last_used_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Tokens are minted by ``inference.tokens.token_create`` so the plaintext is shown once.
        return False


@admin.register(AlertSettings)
class AlertSettingsAdmin(admin.ModelAdmin):
    """The alert thresholds (one row; docs/alerts.md)."""

    list_display = ("__str__", "error_rate_max", "ttft_p95_max_s", "window_s")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return not AlertSettings.objects.exists()

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
