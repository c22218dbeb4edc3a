"""The worker agent: GPU discovery, the job runner, the agent process."""
