"""The call effects a flow can make beside its ledger row: HTTP (http) and its
headers' checks (http_headers). The Python and SQL effects are core's and ledger's.
"""
