"""The two exercises onceq began from: their presets (orders, claims), the
`processed` table, their flows, the 0.1.0 names (orders_0_1_0, claims_0_1_0), the
lab scripts, the partner stubs and the built-in samples.
"""
