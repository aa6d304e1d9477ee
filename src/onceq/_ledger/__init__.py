"""The ledger: the dedup rows, attempts, failures and dead-letter operations, written
in the group commit; SQLite (sqlite) and PostgreSQL (pg/) backends, migrations,
retention, and where a ledger lives (target). Imports only core.
"""
