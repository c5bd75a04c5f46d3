"""The shared plumbing every app uses, which imports no app (``nodes``, ``inference``) and no
page: API errors, the audit log, compiled SQL, the bare HTTP handler and its body limit, the
management-command base. The import-linter contracts in ``pyproject.toml`` check it."""
