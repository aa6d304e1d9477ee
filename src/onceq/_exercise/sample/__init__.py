"""The built-in samples, and copying them out for a user to work on.

Orders (this folder's msg-*.json): 20 messages in the shape of the seed exercise,
18 valid, 3 of which repeat an earlier msg_id (15 unique); msg-009.json does not
parse; msg-015.json has no amount.

Claims (claims/*.json): 9 claim files for the RabbitMQ pipeline: 6 accepted, 1
re-sent copy of claim-002, one without docs (the claim system answers 422) and
one whose claimId starts with BUSY (503 every time).

Invoices (invoices/*.json): 8 files in the shape of the invoice example
(`onceq partner invoices`): 4 accepted (INV-1, INV-2, INV-3 and "INV 7/A", whose id
needs URL-encoding), 1 re-sent copy of INV-1, 1 negative total (the partner answers
422), 1 whose customer starts with BUSY (503 every time) and 1 without an invoiceId.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

from onceq.errors import Conflict, UsageError

# Where `copy_sample` puts each set under the target folder.
SETS = {"orders": "", "claims": "claims", "invoices": "invoices"}


def sample_dir() -> Path:
    return Path(__file__).parent


def sample_files() -> dict[str, list[Path]]:
    """{set name: the built-in files of that set, by name}."""
    return {name: sorted((sample_dir() / sub).glob("*.json")) for name, sub in SETS.items()}


def copy_sample(dest: str | Path) -> dict[str, list[Path]]:
    """Copy the orders into DEST/orders/ and the claims into DEST/claims/.

    Refuses (Conflict), changing nothing, when any target file exists already: a
    user's edited fixture is theirs, and a half-copied sample would silently mix
    their files with ours. A failure half-way removes what this call created, for
    the same reason. Returns {set name: the files written}.
    """
    root = Path(dest)
    if os.path.lexists(root) and not root.is_dir():
        raise Conflict(f"{root}: exists and is not a folder")
    plan = {
        name: [(p, root / name / p.name) for p in files] for name, files in sample_files().items()
    }
    _check_free(t for pairs in plan.values() for _, t in pairs)
    made_dirs: list[Path] = []
    written: list[Path] = []
    try:
        for folder in [root, *(root / name for name in plan)]:
            if not folder.is_dir():
                folder.mkdir(parents=True)
                made_dirs.append(folder)
        for pairs in plan.values():
            for src, target in pairs:
                # O_EXCL: a file that appeared since the check is refused, never replaced.
                with open(target, "xb") as f:
                    written.append(target)
                    f.write(src.read_bytes())
    except OSError as exc:
        for p in reversed(written):
            p.unlink(missing_ok=True)
        for d in reversed(made_dirs):
            with contextlib.suppress(OSError):
                d.rmdir()
        if isinstance(exc, FileExistsError):
            raise Conflict(f"{exc.filename}: exists already; nothing copied") from exc
        raise UsageError(f"{exc.filename or root}: cannot copy the sample: {exc.strerror}") from exc
    return {name: [t for _, t in pairs] for name, pairs in plan.items()}


def _check_free(targets: Iterable[Path]) -> None:
    """Conflict naming the first target that exists (checked before anything is made)."""
    for target in targets:
        if os.path.lexists(target):
            raise Conflict(f"{target}: exists already; nothing copied")
