"""Reliability tests: fault runs, fuzzing and the real-time fidelity replays."""

# The xdist group of the tests that replay a trace in real time against the simulator
# (test_fidelity.py, test_fidelity_cloud.py). Each starts a Redis, a scheduler and 5-20 agents;
# two at once on a 2-core machine stretch the dispatch delays' tail past what the simulator's
# measured means stand for (CI at 2026-12-06: machine load 13, dispatch p95 0.36 s against a
# mean of 0.12 s, and 7 launches real against 5 simulated). One worker runs them one after
# the other; the suite's other workers go on beside them.
REALTIME = "realtime-replay"
