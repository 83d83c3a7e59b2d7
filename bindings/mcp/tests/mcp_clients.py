"""C-MCP-1 and C-MCP-3 with the official MCP client (mcp==2.3.0).

Drives the built `abhyasa mcp` binary over stdio in both eras:
mode="auto" (2026-07-28 `server/discover`) and mode="legacy"
(`initialize`): tools/list, every tool with good and bad arguments, a call
carrying a custody envelope in `_meta` (the revoked tool call is refused and
the ack comes back in `_meta`), and the node tools against two running
nodes (started here with `abhyasa init` + `abhyasa node run`).

Usage: python mcp_clients.py /path/to/abhyasa
Exits non-zero on any failure.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mcp.client import Client
from mcp.client.stdio import StdioServerParameters

ENVELOPE_KEY = "io.github.ravikiran438/abhyasa"
TOOLS = [
    "validate_obligation",
    "validate_custody_ack",
    "validate_abhyasa_service_ref",
    "check_admissibility",
    "compute_safe_action",
    "run_custody_transfer",
    "send_obligation",
    "obligation_status",
    "inbox",
    "escalations",
    "decide",
]

FAILURES: list[str] = []
CHECKS = 0


def check(cond: bool, what: str) -> None:
    global CHECKS
    CHECKS += 1
    if not cond:
        FAILURES.append(what)
        print(f"FAIL: {what}", flush=True)


def now_rfc3339() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def obligation(oid: str, target: str, decision: str = "revoke", scope: str = "email.read",
               sequence: int | None = None, deadline: int = 60) -> dict:
    o = {
        "obligation_id": oid,
        "kind": "anumati.consent",
        "target": target,
        "payload": {"decision": decision, "scope": scope},
        "deadline_seconds": deadline,
        "max_retries": 20,
        "created_at": now_rfc3339(),
    }
    if sequence is not None:
        o["sequence"] = sequence
    return o


def body_of(result) -> dict:
    text = result.content[0].text
    body = json.loads(text)
    if result.structured_content is not None:
        check(result.structured_content == body, "structured content equals the text")
    return body


async def call(client: Client, name: str, args: dict | None, meta: dict | None = None):
    r = await client.call_tool(name, args, meta=meta)
    return bool(r.is_error), body_of(r), r


async def pure_tools(client: Client, era: str) -> None:
    tools = await client.list_tools()
    names = [t.name for t in tools.tools]
    check(names == TOOLS, f"[{era}] tools/list names: {names}")

    good = obligation("c-1", "bob")
    err, b, _ = await call(client, "validate_obligation", {"obligation": good})
    check(not err and b["ok"] is True and b["obligation"] == "valid", f"[{era}] validate_obligation good: {b}")
    bad = dict(good, deadline_seconds="60")
    err, b, _ = await call(client, "validate_obligation", {"obligation": bad})
    check(err and b["ok"] is False and "deadline_seconds" in b["error"], f"[{era}] validate_obligation bad: {b}")
    err, b, _ = await call(client, "validate_obligation", {})
    check(err and "obligation" in b["error"], f"[{era}] validate_obligation missing: {b}")

    ack = {"obligation_id": "c-1", "target": "bob", "status": "applied", "acked_at": now_rfc3339()}
    err, b, _ = await call(client, "validate_custody_ack", {"ack": ack})
    check(not err and b["ack"] == "valid", f"[{era}] validate_custody_ack good: {b}")
    err, b, _ = await call(client, "validate_custody_ack", {"ack": dict(ack, status="lost")})
    check(err and "status" in b["error"], f"[{era}] validate_custody_ack bad: {b}")

    kind = {"kind": "anumati.consent", "obligation_endpoint": "https://bob.example/abhyasa/obligations",
            "deadline_seconds": 3600, "max_retries": 100, "backoff": "exponential",
            "backoff_base_seconds": 1.0, "backoff_cap_seconds": 60}
    ref = {"version": "1.0.0", "custody_ack_endpoint": "https://alice.example/abhyasa/custody_ack",
           "supported_kinds": [kind]}
    err, b, _ = await call(client, "validate_abhyasa_service_ref", {"ref": ref})
    check(not err and b["ref"] == "valid", f"[{era}] service ref good: {b}")
    err, b, _ = await call(client, "validate_abhyasa_service_ref",
                           {"ref": dict(ref, supported_kinds=[dict(kind, max_retries=6)])})
    check(err and "max_retries" in b["error"], f"[{era}] service ref AB-2: {b}")

    err, b, _ = await call(client, "check_admissibility", {"obligation": good})
    check(not err and b["admissible"] is True and b["carried"] == "custody", f"[{era}] admissible: {b}")
    grant = obligation("c-2", "bob", decision="grant")
    err, b, _ = await call(client, "check_admissibility", {"obligation": grant})
    check(not err and b["admissible"] is False and b["carried"] == "best_effort", f"[{era}] grant: {b}")
    err, b, _ = await call(client, "check_admissibility", {"obligation": 5})
    check(err, f"[{era}] check_admissibility bad: {b}")

    err, b, _ = await call(client, "compute_safe_action", {"obligation": good})
    check(not err and b["safe_action"]["effect"] == "fail_closed", f"[{era}] safe action: {b}")
    err, b, _ = await call(client, "compute_safe_action", {"obligation": grant})
    check(not err and b["ok"] is False and "not admissible" in b["error"], f"[{era}] safe inadmissible: {b}")

    err, b, _ = await call(client, "run_custody_transfer", {"obligation": good})
    check(not err and b["terminal"] == "applied" and b["discharged"] is True, f"[{era}] transfer: {b}")
    for k in ("terminal", "attempts", "discharged", "escalations", "routing_weights"):
        check(k in b, f"[{era}] run_custody_transfer has {k}")
    err, b, _ = await call(client, "run_custody_transfer",
                           {"obligation": dict(good, deadline_seconds=20),
                            "channel": {"drop_prob": 1.0, "seed": 1}})
    check(not err and b["terminal"] == "escalated" and len(b["escalations"]) == 1, f"[{era}] escalated: {b}")
    err, b, _ = await call(client, "run_custody_transfer",
                           {"obligation": good, "receiver_decision": "declined"})
    check(not err and b["terminal"] == "declined", f"[{era}] declined: {b}")
    err, b, _ = await call(client, "run_custody_transfer", {"obligation": good, "channel": {"drop_prob": 3}})
    check(err and "drop_prob" in b["error"], f"[{era}] bad channel: {b}")
    err, b, _ = await call(client, "run_custody_transfer", {"obligation": good, "receiver_decision": "maybe"})
    check(err and "receiver_decision" in b["error"], f"[{era}] bad decision: {b}")
    err, b, _ = await call(client, "no_such_tool", {})
    check(err and "unknown tool" in b["error"], f"[{era}] unknown tool: {b}")


async def envelope(client: Client, era: str, n: int) -> None:
    """C-MCP-1: the server guards run_custody_transfer with consent scope sim.run."""
    sim_args = {"obligation": obligation(f"x-{era}", "bob")}
    err, b, _ = await call(client, "run_custody_transfer", sim_args)
    check(not err, f"[{era}] guarded tool runs before the revocation: {b}")
    revoke = obligation(f"guard-{era}", "mcp-server", scope="sim.run", sequence=2 * n + 1, deadline=600)
    meta = {ENVELOPE_KEY: {"obligation": revoke}}
    err, b, r = await call(client, "run_custody_transfer", sim_args, meta=meta)
    check(err and b["ok"] is False and "withdrawn" in b["error"], f"[{era}] revoked call refused: {b}")
    reply = (r.meta or {}).get(ENVELOPE_KEY, {})
    ack = reply.get("ack", {})
    check(ack.get("obligation_id") == revoke["obligation_id"] and ack.get("status") == "applied",
          f"[{era}] ack in result _meta: {r.meta}")
    # Redelivery: re-acked, still refused.
    err, b, r = await call(client, "run_custody_transfer", sim_args, meta=meta)
    check(err and (r.meta or {}).get(ENVELOPE_KEY, {}).get("ack", {}).get("status") == "applied",
          f"[{era}] redelivery re-acked: {r.meta}")
    # An ungoverned tool still runs, and carries the ack of its envelope.
    err, b, r = await call(client, "check_admissibility", {"obligation": revoke}, meta=meta)
    check(not err and ENVELOPE_KEY in (r.meta or {}), f"[{era}] ungoverned tool runs: {b}")
    # A malformed envelope refuses the call and names the field.
    err, b, r = await call(client, "check_admissibility", {"obligation": revoke},
                           meta={ENVELOPE_KEY: {"obligation": dict(revoke, max_retries=-1)}})
    check(err and "max_retries" in json.dumps(r.meta), f"[{era}] malformed envelope: {r.meta}")
    # A newer grant restores the tool.
    grant = obligation(f"guard-grant-{era}", "mcp-server", decision="grant", scope="sim.run",
                       sequence=2 * n + 2, deadline=600)
    err, b, r = await call(client, "run_custody_transfer", sim_args,
                           meta={ENVELOPE_KEY: {"obligation": grant}})
    check(not err and (r.meta or {}).get(ENVELOPE_KEY, {}).get("ack", {}).get("status") == "applied",
          f"[{era}] grant restores the tool: {b} {r.meta}")


def free_udp_port() -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def init_node(binary: str, d: Path, agent: str, port: int) -> str:
    out = subprocess.run([binary, "init", "--dir", str(d), "--agent", agent, "--listen", f"127.0.0.1:{port}"],
                         check=True, capture_output=True, text=True).stdout
    return out[out.index("[[peers]]"):]


def start_nodes(binary: str, root: Path) -> list[subprocess.Popen]:
    a, b = root / "alice", root / "bob"
    pa, pb = free_udp_port(), free_udp_port()
    peer_a = init_node(binary, a, "alice", pa)
    peer_b = init_node(binary, b, "bob", pb)
    with open(a / "config.toml", "a") as f:
        f.write("\n" + peer_b)
    with open(b / "config.toml", "a") as f:
        f.write("\n" + peer_a)
    procs = []
    for d in (a, b):
        log = open(d / "node.log", "w")
        procs.append(subprocess.Popen([binary, "node", "run", "--dir", str(d), "--log-level", "warn"],
                                      stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
    deadline = time.time() + 30
    while time.time() < deadline:
        if (a / "control.sock").exists() and (b / "control.sock").exists():
            return procs
        time.sleep(0.1)
    raise RuntimeError("nodes did not start (see node.log)")


async def node_tools(client: Client, era: str) -> None:
    oid = f"node-{era}"
    err, b, _ = await call(client, "send_obligation", {"obligation": obligation(oid, "bob"), "wait": True})
    check(not err and b["offer"]["outcome"]["state"] == "applied", f"[{era}] send_obligation applied: {b}")
    err, b, _ = await call(client, "obligation_status", {"obligation_id": oid})
    check(not err and b["ok"] is True, f"[{era}] obligation_status: {b}")
    err, b, _ = await call(client, "obligation_status", {"obligation_id": "never-sent"})
    check(err and "not known" in b["error"], f"[{era}] unknown obligation: {b}")
    err, b, _ = await call(client, "send_obligation", {"obligation": obligation(f"{oid}-x", "mallory")})
    check(err and "pinned peer" in b["error"], f"[{era}] unreachable target: {b}")
    err, b, _ = await call(client, "send_obligation", {"obligation": {"kind": 1}})
    check(err and "invalid obligation" in b["error"], f"[{era}] bad obligation: {b}")
    err, b, _ = await call(client, "inbox", {})
    check(not err and isinstance(b["inbox"], dict), f"[{era}] inbox: {b}")
    err, b, _ = await call(client, "escalations", {})
    check(not err and "escalations" in b and "decisions" in b, f"[{era}] escalations: {b}")
    err, b, _ = await call(client, "decide", {"key": "anumati.consent/bob/scope:email.read",
                                              "decision": "granted"})
    check(not err and b["ok"] is True, f"[{era}] decide: {b}")
    err, b, _ = await call(client, "decide", {"key": "k", "decision": "yes"})
    check(err and "granted|withheld" in b["error"], f"[{era}] decide bad: {b}")
    err, b, _ = await call(client, "decide", {"obligation_id": "nope", "resolution": "dismiss"})
    check(err, f"[{era}] resolve unknown: {b}")


async def main(binary: str) -> int:
    with tempfile.TemporaryDirectory(prefix="abhyasa-mcp-") as tmp:
        root = Path(tmp)
        procs = start_nodes(binary, root)
        try:
            for n, era in enumerate(("auto", "legacy")):
                guard_store = root / f"guard-{era}"
                params = StdioServerParameters(
                    command=binary,
                    args=["mcp", "--dir", str(root / "alice"),
                          "--agent", "mcp-server", "--custodian", "assistant",
                          "--guard-store", str(guard_store),
                          "--require", 'run_custody_transfer=anumati.consent:{"scope":"sim.run"}'],
                )
                async with Client(params, mode=era) as client:
                    version = client.protocol_version
                    if era == "auto":
                        check(version == "2026-07-28", f"auto negotiated 2026-07-28 (got {version})")
                    else:
                        check(version != "2026-07-28" and re.match(r"20\d\d-\d\d-\d\d", version or ""),
                              f"legacy negotiated a handshake-era version (got {version})")
                    print(f"[{era}] protocol {version}", flush=True)
                    await pure_tools(client, era)
                    await envelope(client, era, n)
                    await node_tools(client, era)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
            if FAILURES:
                for d in ("alice", "bob"):
                    log = root / d / "node.log"
                    if log.exists():
                        print(f"--- {d} node.log ---\n{log.read_text()[-4000:]}")
    print(f"{CHECKS - len(FAILURES)}/{CHECKS} checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: mcp_clients.py /path/to/abhyasa", file=sys.stderr)
        sys.exit(2)
    sys.exit(asyncio.run(main(os.path.abspath(sys.argv[1]))))
