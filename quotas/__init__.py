"""Event Hubs tier quotas (limits as data, usage accounting, the admit decision)."""
