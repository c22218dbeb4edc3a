"""Money: the ledger, its read API and the spend report (data, window, amounts, terminal,
HTML)."""
