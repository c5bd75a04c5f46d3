"""URLs of the operator pages (namespace ``console``)."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import path, re_path

from console import loadtest_pages, upgrade_pages, validation_pages, views

app_name = "console"

urlpatterns = [
    path("", views.overview, name="overview"),
    path(
        "login/",
        auth_views.LoginView.as_view(
            template_name="console/login.html", redirect_authenticated_user=True
        ),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(next_page="console:login"), name="logout"),
    path("nodes/", views.nodes, name="nodes"),
    path("nodes/<slug:node_id>/", views.node, name="node"),
    path("nodes/<slug:node_id>/edit/", views.node_edit, name="node_edit"),
    path("nodes/<slug:node_id>/remove/", views.node_remove, name="node_remove"),
    path("nodes/<slug:node_id>/drain/", views.node_drain, name="node_drain"),
    path("nodes/<slug:node_id>/undrain/", views.node_undrain, name="node_undrain"),
    path("nodes/<slug:node_id>/restart/", views.node_restart, name="node_restart"),
    path("packages/", views.packages, name="packages"),
    path("packages/<int:package_id>/", views.package, name="package"),
    path("packages/<int:package_id>/<slug:action>/", views.package_action, name="package_action"),
    path("upgrades/", upgrade_pages.upgrades, name="upgrades"),
    path("upgrades/<int:upgrade_id>/", upgrade_pages.upgrade, name="upgrade"),
    path(
        "upgrades/<int:upgrade_id>/<slug:action>/",
        upgrade_pages.upgrade_action,
        name="upgrade_action",
    ),
    path("loadtests/", loadtest_pages.loadtests, name="loadtests"),
    path("loadtests/<int:run_id>/", loadtest_pages.loadtest, name="loadtest"),
    path("loadtests/<int:run_id>/stop/", loadtest_pages.loadtest_stop, name="loadtest_stop"),
    path(
        "loadtests/<int:run_id>/profiles/<slug:name>.svg",
        loadtest_pages.loadtest_profile,
        name="loadtest_profile",
    ),
    path("validation/", validation_pages.validation, name="validation"),
    path("validation/<slug:node_id>/", validation_pages.validation_node, name="validation_node"),
    path(
        "validation/<slug:node_id>/validate/",
        validation_pages.validation_start,
        name="validation_start",
    ),
    path(
        "validation/<slug:node_id>/waive/",
        validation_pages.validation_waive,
        name="validation_waive",
    ),
    path("routing/", views.routing, name="routing"),
    path("routing/table/", views.routing_table, name="routing_table"),
    re_path(r"^sessions/(?P<session_id>[^/]+)/$", views.session, name="session"),
    re_path(
        r"^sessions/(?P<session_id>[^/]+)/release/$", views.session_release, name="session_release"
    ),
    path("utilization/", views.utilization, name="utilization"),
    path("playground/", views.playground, name="playground"),
    path("tokens/", views.tokens, name="tokens"),
    path("tokens/<int:token_id>/revoke/", views.token_revoke, name="token_revoke"),
    path("config/", views.config, name="config"),
    path("config/phalanx.yaml", views.config_download, name="config_download"),
    path("audit/", views.audit, name="audit"),
]
