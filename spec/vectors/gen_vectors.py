#!/usr/bin/env python3
"""Generates spec/vectors/digests.json with an implementation independent of
the Rust one: RFC 8785 (JCS) for the value subset the vectors use, SHA-256
over the canonical v1 object. Python stdlib only.

    python3 spec/vectors/gen_vectors.py > spec/vectors/digests.json
"""
import hashlib
import json
from datetime import datetime, timezone


def jcs(v):
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v == int(v) and abs(v) < 1e21:
            return str(int(v))
        r = repr(v)
        assert "e" not in r, "vectors avoid exponent floats (Python and ES spell them differently)"
        return r
    if isinstance(v, str):
        out = ['"']
        for c in v:
            o = ord(c)
            if c == '"':
                out.append('\\"')
            elif c == "\\":
                out.append("\\\\")
            elif c == "\b":
                out.append("\\b")
            elif c == "\f":
                out.append("\\f")
            elif c == "\n":
                out.append("\\n")
            elif c == "\r":
                out.append("\\r")
            elif c == "\t":
                out.append("\\t")
            elif o < 0x20:
                out.append("\\u%04x" % o)
            else:
                out.append(c)
        out.append('"')
        return "".join(out)
    if isinstance(v, list):
        return "[" + ",".join(jcs(x) for x in v) + "]"
    if isinstance(v, dict):
        keys = sorted(v.keys(), key=lambda k: k.encode("utf-16-be"))
        return "{" + ",".join(jcs(k) + ":" + jcs(v[k]) for k in keys) + "}"
    raise TypeError(type(v))


def canonical_time(s):
    dt = datetime.fromisoformat(s.replace("Z", "+00:00")).astimezone(timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def v1_object(ob):
    o = {k: ob[k] for k in ("obligation_id", "kind", "target", "deadline_seconds", "max_retries")}
    o["payload"] = ob.get("payload", {})
    o["created_at"] = canonical_time(ob["created_at"])
    if ob.get("sequence") is not None:
        o["sequence"] = ob["sequence"]
    return o


VECTORS = [
    ("anumati-revoke", {
        "obligation_id": "ob-0001", "kind": "anumati.consent", "target": "agent-b",
        "payload": {"decision": "revoke", "scope": "email.read"},
        "deadline_seconds": 3600, "max_retries": 64, "created_at": "2026-06-09T12:00:00Z"}),
    ("anumati-revoke-sequenced", {
        "obligation_id": "ob-0002", "kind": "anumati.consent", "target": "agent-b",
        "payload": {"scope": "calendar.write"},
        "deadline_seconds": 3600, "max_retries": 64, "created_at": "2026-06-09T12:00:00.5Z",
        "sequence": 42}),
    ("phala-corrective-float", {
        "obligation_id": "bu-0", "kind": "phala.belief_update", "target": "router-7",
        "payload": {"weight_delta": -0.4, "weight_key": "routing.router-7.preference", "valence": -1.25},
        "deadline_seconds": 600, "max_retries": 64, "created_at": "2026-06-09T12:00:00.123456+00:00"}),
    ("oauth-revoke-offset-and-unicode", {
        "obligation_id": "tok-rev-9", "kind": "oauth.token", "target": "resource-gw",
        "payload": {"action": "revoke", "token_id": "t-\u65e5\u672c-\u00e9",
                    "note": "line1\nline2 \"quoted\" \\ tab\t ctl\u0001",
                    "scopes": ["read", "write", 3, 2.5, True, None, {"z": 1, "a": -0.0}]},
        "deadline_seconds": 86400, "max_retries": 2000, "created_at": "2026-06-09T17:30:00.000001+05:30"}),
    ("unknown-kind-empty-payload", {
        "obligation_id": "x", "kind": "acme.custom", "target": "y",
        "payload": {},
        "deadline_seconds": 1, "max_retries": 0, "created_at": "1970-01-01T00:00:00Z", "sequence": 0}),
    ("key-order-utf16", {
        "obligation_id": "order", "kind": "acme.custom", "target": "y",
        "payload": {"b": 1, "a": 2, "A": 3, "_": 4, "\u00e9": 5, "\ufb33": 6, "\U0001f600": 7, "aa": 8},
        "deadline_seconds": 10, "max_retries": 5, "created_at": "2026-01-01T00:00:00Z"}),
]


def main():
    out = []
    for name, ob in VECTORS:
        canon = jcs(v1_object(ob))
        out.append({
            "name": name,
            "obligation": ob,
            "canonical": canon,
            "digest": hashlib.sha256(canon.encode("utf-8")).hexdigest(),
        })
    print(json.dumps({"description": "Abhyasa v1 content digests: SHA-256 over JCS (RFC 8785) of the eight v1 fields; created_at canonical UTC with six fractional digits; sequence omitted when absent.", "vectors": out}, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
