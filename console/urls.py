from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from console.api import api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("v1/", include("inference.urls")),
    path("api/", api.urls),
]
