from __future__ import annotations

from django.contrib import admin
from django.urls import include, path, re_path
from django.views.generic import RedirectView

from console import ops_views
from console.api import api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("v1/", include("inference.urls")),
    path("api/", api.urls),
    path("health", ops_views.health, name="health"),
    path("favicon.ico", RedirectView.as_view(url="/static/console/favicon.svg", permanent=True)),
    path("metrics", ops_views.metrics, name="metrics"),
    re_path(r"^static/(?P<path>.*)$", ops_views.static, name="static"),
    path("", include("console.page_urls")),
]
