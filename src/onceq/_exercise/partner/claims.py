"""The claim system's rules (`onceq partner claim`), run by the stub engine.

    POST /v1/claims   400 body not a JSON object
                      422 docs missing or empty          (business rejection)
                      503 claimId starts with BUSY        (transient)
                      201 otherwise
    /_stats counts calls by_guid (the message id) and by_claim (claimId).

The claim system keeps no memory: the same guid twice is 201 twice, so the tests can
count the calls a consumer makes instead of the claims the partner keeps.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar


def classify(doc: Any) -> int:
    """The status the claim system gives a parsed body."""
    if not isinstance(doc, dict):
        return 400
    docs = doc.get("docs")
    if not docs:  # missing, null, empty list / string / object
        return 422
    if str(doc.get("claimId", "")).startswith("BUSY"):
        return 503
    return 201


_ERRORS = {
    400: "body is not a JSON object",
    422: "docs missing or empty",
    503: "claim system busy",
}


class Claims:
    title = "claim system"
    path = "/v1/claims"
    id_field = "guid"
    id_stat = "by_guid"
    tallies: ClassVar[Mapping[str, str]] = {"by_claim": "claimId"}
    default_port = 9202

    def answer(self, doc: Any, ident: str) -> tuple[int, dict[str, Any]]:
        status = classify(doc)
        if status == 201:
            return status, {"status": "accepted", "guid": ident}
        return status, {"error": _ERRORS[status]}

    def reset(self) -> None:
        """Nothing to forget: the claim system remembers no claim."""
