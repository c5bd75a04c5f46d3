from __future__ import annotations

from django.contrib import admin

from console.lib.read_only_admin import ReadOnlyAdmin
from nodes.models import Node, NodeEvent, NodeJoinToken


class NodeEventInline(admin.TabularInline):
    model = NodeEvent
    extra = 0
    can_delete = False
    readonly_fields = ("kind", "message", "created_at")
    ordering = ("-created_at",)
    max_num = 0


@admin.register(Node)
class NodeAdmin(ReadOnlyAdmin):
    list_display = (
        "node_id",
        "address",
        "state",
        "weight",
        "affinity",
        "package",
        "load_display",
        "consecutive_failures",
        "last_probe_at",
    )
    list_filter = ("state", "package")
    search_fields = ("node_id", "address")
    readonly_fields = (
        "consecutive_failures",
        "last_probe_at",
        "last_probe_error",
        "last_seen_load",
        "created_at",
        "updated_at",
    )
    inlines = [NodeEventInline]

    @admin.display(description="load")
    def load_display(self, obj: Node) -> str:
        return "unknown" if obj.load is None else f"{obj.load:.2f}"


@admin.register(NodeEvent)
class NodeEventAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "node", "kind", "message")
    list_filter = ("kind", "node")
    readonly_fields = ("node", "kind", "message", "created_at")


@admin.register(NodeJoinToken)
class NodeJoinTokenAdmin(ReadOnlyAdmin):
    """Join tokens as kept: prefix and hash only (minted on the console or the API)."""

    list_display = ("prefix", "note", "created_by", "created_at", "expires_at", "used_at")
    search_fields = ("prefix", "note", "joined_node_id")
