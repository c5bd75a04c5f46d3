"""Rolling upgrades: a persisted plan (``inference.Upgrade``) the control loop drives node by
node (``driver``), with pure planning and gates (``plan``) and the operator's actions
(``services``). See docs/upgrades.md."""
