"""Usage, cost and quotas per API token (docs/usage.md): every turn counted at the proxy
(``recorder``), priced from the cost model (``costs``), limited per token (``limits``) and
queued by priority when the control plane is full (``priority``)."""
