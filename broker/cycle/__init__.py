"""The scheduling cycle: its input and output (plan), the snapshot builder, the pure cycle
(scheduler), the actuator and the submit-time feasibility check."""
