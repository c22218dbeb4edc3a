"""The cloud: the burst policies, what they share (offers, forecast), spot with deadlines and
budgets at placement."""
