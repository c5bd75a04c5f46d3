"""The Django admin shows the array's models but changes none of them: every change goes through
the services (which validate, send live events and write the audit log): the console pages,
the admin API, the config file."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest


class ReadOnlyAdmin(admin.ModelAdmin):
    """A ``ModelAdmin`` that lists and shows, and refuses add, change and delete."""

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
