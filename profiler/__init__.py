"""`edgeserve-profile`: the per-device latency table (and per-exit accuracy) of repository models.

Modules: measure (timing cells), evaluate (accuracy into the manifest), report (printed table),
plot (optional figure), cli (the command).
"""
