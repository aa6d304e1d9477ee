"""The Flow (a source, a message spec, an effect), the flow file's builder, and the
one runner every way in calls.
"""
