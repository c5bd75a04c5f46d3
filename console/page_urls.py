"""URLs of the operator pages (namespace ``console``)."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import path, re_path

from console import (
    alert_pages,
    cache_pages,
    config_pages,
    join_pages,
    loadtest_pages,
    log_pages,
    node_pages,
    package_pages,
    playground_pages,
    prefix_pages,
    routing_pages,
    token_pages,
    upgrade_pages,
    usage_pages,
    validation_pages,
)

app_name = "console"

urlpatterns = [
    path("", node_pages.overview, name="overview"),
    path(
        "login/",
        auth_views.LoginView.as_view(
            template_name="console/login.html", redirect_authenticated_user=True
        ),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(next_page="console:login"), name="logout"),
    path("nodes/", node_pages.nodes, name="nodes"),
    path("nodes/<slug:node_id>/", node_pages.node, name="node"),
    path("nodes/<slug:node_id>/edit/", node_pages.node_edit, name="node_edit"),
    path("nodes/<slug:node_id>/remove/", node_pages.node_remove, name="node_remove"),
    path("nodes/<slug:node_id>/drain/", node_pages.node_drain, name="node_drain"),
    path("nodes/<slug:node_id>/undrain/", node_pages.node_undrain, name="node_undrain"),
    path("nodes/<slug:node_id>/restart/", node_pages.node_restart, name="node_restart"),
    path("nodes/<slug:node_id>/revoke/", join_pages.node_revoke, name="node_revoke"),
    path("join-tokens/", join_pages.join_tokens, name="join_tokens"),
    path("packages/", package_pages.packages, name="packages"),
    path("packages/<int:package_id>/", package_pages.package, name="package"),
    path(
        "packages/<int:package_id>/<slug:action>/",
        package_pages.package_action,
        name="package_action",
    ),
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
    path("routing/", routing_pages.routing, name="routing"),
    path("routing/table/", routing_pages.routing_table, name="routing_table"),
    re_path(r"^sessions/(?P<session_id>[^/]+)/$", routing_pages.session, name="session"),
    re_path(
        r"^sessions/(?P<session_id>[^/]+)/release/$",
        routing_pages.session_release,
        name="session_release",
    ),
    path("utilization/", node_pages.utilization, name="utilization"),
    path("playground/", playground_pages.playground, name="playground"),
    path("tokens/", token_pages.tokens, name="tokens"),
    path("tokens/<int:token_id>/revoke/", token_pages.token_revoke, name="token_revoke"),
    path("tokens/<int:token_id>/quota/", token_pages.token_quota, name="token_quota"),
    path("tokens/roles/<str:role>/quota/", token_pages.role_quota, name="role_quota"),
    path("config/", config_pages.config, name="config"),
    path("config/phalanx.yaml", config_pages.config_download, name="config_download"),
    path("audit/", config_pages.audit, name="audit"),
    path("logs/", log_pages.logs, name="logs"),
    path("cache/", cache_pages.cache, name="cache"),
    path("cache/namespace/", cache_pages.cache_namespace, name="cache_namespace"),
    path("cache/invalidate/", cache_pages.cache_invalidate, name="cache_invalidate"),
    path("prefixes/", prefix_pages.prefixes, name="prefixes"),
    path("prefixes/register/", prefix_pages.prefix_register, name="prefix_register"),
    path("prefixes/<slug:name>/remove/", prefix_pages.prefix_remove, name="prefix_remove"),
    path("usage/", usage_pages.usage, name="usage"),
    path("alerts/", alert_pages.alerts, name="alerts"),
    path(
        "alerts/<int:alert_id>/acknowledge/",
        alert_pages.alert_acknowledge,
        name="alert_acknowledge",
    ),
    path("alerts/<int:alert_id>/resolve/", alert_pages.alert_resolve, name="alert_resolve"),
]
