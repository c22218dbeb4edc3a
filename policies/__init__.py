"""Scheduling policies: pure functions over a Snapshot, registered by role and name.

Nothing here imports Celery, Redis or a cloud SDK.
"""
