"""Benchmarks behind spillway bench: the suite, raw Celery's reference, the CLI's timings, spot
with a deadline, the carbon shift."""
