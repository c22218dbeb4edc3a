"""The message bus: the Celery app, every command sent by name, and each process's wiring
(runtime)."""
