"""Django settings for the Phalanx control plane.

Embedded default: SQLite under ``var/``, local-memory cache, in-memory channel layer.
Scale-out: set ``DATABASE_URL`` (PostgreSQL) and ``REDIS_URL`` (channels-redis and the
shared cache) so that several control-plane replicas agree on every route.
"""

from __future__ import annotations

import os
from pathlib import Path

from console.lib.logs import logging_config

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("PHALANX_HOME", BASE_DIR / "var"))
MODEL_DIR = VAR_DIR / "models"
# Threads a package job (quantization build, evaluation node) uses; the embedded array pins its
# nodes to one CPU each, so one thread leaves the rest of the machine to them.
PACKAGE_JOB_THREADS = int(os.environ.get("PHALANX_PACKAGE_JOB_THREADS", 1))
# Where path imports over the API and the pages may read (empty: anywhere the process can).
PACKAGE_IMPORT_DIRS = [d for d in os.environ.get("PHALANX_IMPORT_DIRS", "").split(":") if d]
PACKAGE_JOB_HEARTBEAT_S = 5.0  # a running job writes heartbeat_at this often
PACKAGE_JOB_STALE_S = float(os.environ.get("PHALANX_PACKAGE_JOB_STALE_S", 30))  # no beat: dead
# Load tests (docs/loadtests.md): the array's own URL, where a run sends its traffic unless it
# names another target (manage.py up sets it to the control plane it starts), and how long a
# running load test's worker may go without a heartbeat before it counts as dead.
LOADTEST_TARGET_URL = os.environ.get("PHALANX_URL", "http://127.0.0.1:8000").rstrip("/")
LOADTEST_STALE_S = float(os.environ.get("PHALANX_LOADTEST_STALE_S", 20))
# Largest GGUF a browser or API upload may send (bytes; 16 GiB by default).
PACKAGE_UPLOAD_MAX_BYTES = int(os.environ.get("PHALANX_PACKAGE_UPLOAD_MAX_BYTES", 16 << 30))

SECRET_KEY = os.environ.get(
    "DJANGO_SECRET_KEY", "phalanx-dev-key-change-me-in-production-0123456789"
)
DEBUG = os.environ.get("DJANGO_DEBUG", "0") == "1"
ALLOWED_HOSTS = os.environ.get(
    "DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1],testserver"
).split(",")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "ninja",  # serves Swagger UI from its own static files, not a CDN
    "nodes",
    "inference",
    "console",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "console.urls"
ASGI_APPLICATION = "console.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
            # {{ moment|when }}: one time format on every page (docs/console.md, "Times")
            "builtins": ["console.templatetags.console_format"],
        },
    },
]


def _database_from_env() -> dict:
    url = os.environ.get("DATABASE_URL")
    if url:
        import dj_database_url  # installed with the "scale" extra

        return dj_database_url.parse(url, conn_max_age=60)
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    return {
        "ENGINE": "django.db.backends.sqlite3",
        # PHALANX_SQLITE: the database file a job process uses (its parent's, which is the test
        # database under pytest; inference/packages/jobs.py)
        "NAME": os.environ.get("PHALANX_SQLITE") or VAR_DIR / "phalanx.sqlite3",
        # Keep connections open between requests (Django closes them by default): reopening
        # one (with the PRAGMAs below) costs about 0.5 ms of every proxied request's TTFT.
        "CONN_MAX_AGE": 600,
        "OPTIONS": {
            "timeout": 20,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
        # A file, not SQLite's in-memory default: the proxy's route writer thread writes while
        # request threads read, which WAL allows and a shared-cache memory database does not.
        "TEST": {"NAME": str(VAR_DIR / "test-phalanx.sqlite3")},
    }


DATABASES = {"default": _database_from_env()}

# Usage accounting, quotas and rate limits per token (docs/usage.md); 0 turns all three off
USAGE_ACCOUNTING = os.environ.get("PHALANX_USAGE_ACCOUNTING", "1") != "0"

REDIS_URL = os.environ.get("REDIS_URL")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL]},
        }
    }
    # the hot path claims placements and reads the lookups' generation here: a Redis that
    # stops answering costs a request at most these timeouts, never the kernel's minutes
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# Bounded input (docs/control-plane.md): an HTTP body past this is a 413 (console/lib/body_limit.py),
# a websocket message past that closes the connection with 1009 (manage.py serve).
MAX_REQUEST_BODY_BYTES = int(os.environ.get("PHALANX_MAX_BODY_BYTES", 8 << 20))
DATA_UPLOAD_MAX_MEMORY_SIZE = MAX_REQUEST_BODY_BYTES
WEBSOCKET_MAX_MESSAGE_BYTES = int(os.environ.get("PHALANX_WS_MAX_MESSAGE_BYTES", 1 << 20))
# Browser origins allowed to open websockets (host names, as ALLOWED_HOSTS: "*.example.com");
# a handshake without Origin (a non-browser client) is allowed and must bring a token.
WEBSOCKET_ALLOWED_ORIGINS = [
    o for o in os.environ.get("PHALANX_WS_ALLOWED_ORIGINS", "").split(",") if o
] or ALLOWED_HOSTS

AUTH_PASSWORD_VALIDATORS: list[dict] = []
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"

LOGGING = logging_config(os.environ.get("PHALANX_LOG_LEVEL", "INFO"))  # console/lib/logs.py
