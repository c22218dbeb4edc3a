"""Prometheus metrics, one module per process: the scheduler's series (``scheduler``, with the
rented machines' in ``cloud``), the worker agent's (``agent``), and what both share: the
/metrics server (``http``). The agent loads ``agent`` and ``http`` only."""
