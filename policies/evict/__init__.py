"""The evict role: the evictor base, the victim rule, and the evictors (scavenge, priority,
move, relief)."""
