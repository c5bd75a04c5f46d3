"""Alerts: rules the control loop evaluates over the array (docs/alerts.md), their rows,
the operator's acknowledge/resolve, signed webhook deliveries and the Prometheus rules file."""
