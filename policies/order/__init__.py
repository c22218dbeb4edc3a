"""Who is considered first: the orderings, fair share, per-team class caps and the runtime
estimate."""
