from __future__ import annotations

from django.urls import path, re_path

from inference import views

urlpatterns = [
    path("chat/completions", views.chat_completions, name="chat-completions"),
    path("models", views.models_list, name="models"),
    path("embeddings", views.embeddings, name="embeddings"),
    re_path(r"^(?P<path>.*)$", views.not_found),
]
