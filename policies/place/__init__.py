"""Where a job goes: placement, backfill reservations and the queue walk (admit, place,
reserve, backfill)."""
