"""Offload (docs/offload.md): plan.py decides which queued tasks go upstream (pure), the offloader
sends them and answers through the task book; breaker.py and link_estimator.py judge each upstream."""
