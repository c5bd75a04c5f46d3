from __future__ import annotations

from django.urls import path, re_path

from inference import views
from inference.semcache import tools_views

urlpatterns = [
    path("chat/completions", views.chat_completions, name="chat-completions"),
    path("models", views.models_list, name="models"),
    path("embeddings", views.embeddings, name="embeddings"),
    path("cache/tools/lookup", tools_views.tools_lookup, name="cache-tools-lookup"),
    path("cache/tools", tools_views.tools_store, name="cache-tools-store"),
    path("cache/false-hits", tools_views.false_hits, name="cache-false-hits"),
    re_path(r"^(?P<path>.*)$", views.not_found),
]
