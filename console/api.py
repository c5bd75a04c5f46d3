"""The project's one NinjaAPI (``/api/``, OpenAPI docs at ``/api/docs``).

Each app adds its own ``Router`` from its ``api.py``; domain errors are mapped to HTTP here.
Authentication and roles live in ``console/access.py``.
"""

from __future__ import annotations

from ninja import NinjaAPI

api = NinjaAPI(title="Phalanx admin API", version="1", urls_namespace="api")


@api.get("/ping", response={200: dict}, auth=None, include_in_schema=False)
def ping(request) -> dict:
    return {"ok": True}
