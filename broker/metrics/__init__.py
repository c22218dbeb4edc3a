"""Prometheus metrics: the series, the /metrics server and the rented machines' series."""
