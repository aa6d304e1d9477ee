"""The header `onceq mq publish` gives each copy it publishes, alone in a module.

The publisher needs only this name of the consumer's side: importing it from the
transport made every `onceq mq publish` load the consume loop's modules (the
transport, its settling and preflight) at start-up, for one string.
"""

from __future__ import annotations

# A random id of one published copy. A delivery tag names a copy only on one channel;
# this names it across crashes, so a redelivery of a copy whose record a killed run
# committed (and never acked) is recognised as *recovered*, not counted as a re-sent
# duplicate. Copies from other publishers lack it: such a redelivery is still acked
# without a call, and counted as a duplicate.
COPY_HEADER = "x-onceq-copy"
