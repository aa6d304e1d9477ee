"""dup.txt and error.csv, written from durable state (the ledger and error/)."""
