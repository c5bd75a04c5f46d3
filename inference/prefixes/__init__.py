"""Shared prefixes registered by operators: agent system prompts with tool schemas that every
node serving their model prefills and keeps (``docs/engine.md, "Registered prefixes"``)."""
