"""The built-in sample: 20 order messages in the shape of the seed exercise.

18 valid, 3 of which repeat an earlier msg_id (15 unique); msg-009.json does not
parse; msg-015.json has no amount.
"""

from pathlib import Path


def sample_dir() -> Path:
    return Path(__file__).parent
