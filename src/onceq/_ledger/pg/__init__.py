"""The PostgreSQL ledger (psycopg 3): the SQLite ledger's contract in a shared database.

`onceq._ledger.target.open_ledger` opens it for a `postgresql://` URL. Its tables live
in a schema of their own (`onceq`), so the ledger can sit inside an application's
database.
"""
