"""Drives the A2A receiver example with the official a2a-sdk client (1.3.0)
and plain httpx: card, SendMessage with the obligation in metadata and the
A2A-Extensions header, applied / declined / deferred-then-final, a
redelivery re-acked without re-applying, and the /abhyasa/* endpoints with
malformed, oversized and unauthenticated requests.

Usage: python a2a_clients.py PATH/TO/a2a_receiver
Exits non-zero on the first failed check.
"""

import asyncio
import datetime
import http.server
import json
import queue
import signal
import subprocess
import sys
import threading
import uuid

import httpx
from a2a.client import A2ACardResolver, ClientCallContext, ClientConfig, ClientFactory
from a2a.client.service_parameters import ServiceParametersFactory, with_a2a_extensions
from a2a.types import Message, Part, Role, SendMessageRequest

URI = "https://ravikiran438.github.io/abhyasa-protocol/v1"
TOKEN = "alice-secret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

pushed: "queue.Queue[tuple[str | None, dict]]" = queue.Queue()


class AckSink(http.server.BaseHTTPRequestHandler):
    """The custodian's custody_ack_endpoint: records pushed final acks."""

    def do_POST(self):  # noqa: N802 (http.server naming)
        n = int(self.headers.get("content-length", "0"))
        body = json.loads(self.rfile.read(n))
        pushed.put((self.headers.get("authorization"), body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", flush=True)
        raise SystemExit(1)
    print(f"ok   {what}", flush=True)


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def obligation(oid, demo=None):
    payload = {"decision": "revoke", "scope": f"scope-{oid}"}
    if demo:
        payload["demo"] = demo
    return {
        "obligation_id": oid,
        "kind": "anumati.consent",
        "target": "bob",
        "payload": payload,
        "deadline_seconds": 60,
        "max_retries": 20,
        "created_at": now(),
    }


async def sdk_checks(base, seen_headers):
    async def record(resp):
        seen_headers.update({k.lower(): v for k, v in resp.headers.items()})

    http = httpx.AsyncClient(
        headers=AUTH,
        timeout=10,
        event_hooks={"response": [record]},
    )
    card = await A2ACardResolver(http, base).get_agent_card()
    ext = [e for e in card.capabilities.extensions if e.uri == URI]
    check(len(ext) == 1 and not ext[0].required, "card advertises the extension, not required")
    params = dict(ext[0].params)
    check(params["custody_ack_endpoint"] == f"{base}/abhyasa/custody_ack",
          "card's custody_ack_endpoint is this server's URL")
    kinds = {k["kind"]: k for k in params["supported_kinds"]}
    check(kinds["anumati.consent"]["obligation_endpoint"] == f"{base}/abhyasa/obligations",
          "card's obligation_endpoint is this server's URL")
    check("abhyasa_bearer" in card.security_schemes
          and card.security_schemes["abhyasa_bearer"].http_auth_security_scheme.scheme == "Bearer",
          "card declares the per-peer bearer scheme")

    config = ClientConfig(httpx_client=http, streaming=False,
                          supported_protocol_bindings=["JSONRPC"])
    client = ClientFactory(config).create(card)
    ctx = ClientCallContext(
        service_parameters=ServiceParametersFactory.create([with_a2a_extensions([URI])]))

    async def send(ob):
        msg = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER,
                      parts=[Part(text="governance obligation")], extensions=[URI])
        msg.metadata.update({URI: ob})
        out = []
        async for ev in client.send_message(SendMessageRequest(message=msg), context=ctx):
            out.append(ev)
        check(len(out) == 1 and out[0].HasField("message"), "SendMessage answers a message")
        return dict(out[0].message.metadata[URI])

    seen_headers.clear()
    ob = obligation("sdk-applied")
    ack = await send(ob)
    check(ack["status"] == "applied" and ack["obligation_id"] == "sdk-applied",
          "SendMessage: applied ack in metadata[URI]")
    check(seen_headers.get("a2a-extensions") == URI, "response echoes the activated extension")

    # The same obligation again (same content, same digest): AB-3.
    again = await send(ob)
    check(again["status"] == "applied", "redelivery re-acked applied")

    ack = await send(obligation("sdk-declined", "decline"))
    check(ack["status"] == "declined" and ack.get("reason") == "policy",
          "SendMessage: declined ack with reason")

    ack = await send(obligation("sdk-deferred", "defer"))
    check(ack["status"] == "deferred", "SendMessage: deferred ack")
    auth, final = pushed.get(timeout=10)
    check(final["obligation_id"] == "sdk-deferred" and final["status"] == "applied",
          "deferred then final: applied ack POSTed to the custody_ack_endpoint")
    await client.close()


async def httpx_checks(base):
    async with httpx.AsyncClient(timeout=10) as h:
        url = f"{base}/abhyasa/obligations"
        r = await h.post(url, json=obligation("http-applied"), headers=AUTH)
        check(r.status_code == 200 and r.json()["status"] == "applied", "POST obligations: 200 applied")
        r = await h.post(url, json=obligation("http-declined", "decline"), headers=AUTH)
        check(r.status_code == 200 and r.json()["status"] == "declined", "POST obligations: 200 declined")
        r = await h.post(url, json=obligation("http-deferred", "defer"), headers=AUTH)
        check(r.status_code == 202 and r.json()["status"] == "deferred", "POST obligations: 202 deferred")
        _, final = pushed.get(timeout=10)
        check(final["obligation_id"] == "http-deferred" and final["status"] == "applied",
              "then the final ack is POSTed to the custodian")
        r = await h.post(url, content=b"{not json", headers=AUTH | {"content-type": "application/json"})
        check(r.status_code == 400 and r.json()["error"]["field"] == "(body)", "malformed body: 400 naming the body")
        bad = obligation("http-bad")
        bad["max_retries"] = "twenty"
        r = await h.post(url, json=bad, headers=AUTH)
        check(r.status_code == 400 and r.json()["error"]["field"] == "max_retries",
              "wrong type: 400 naming max_retries")
        big = obligation("http-big")
        big["payload"]["pad"] = "x" * (200 * 1024)
        r = await h.post(url, json=big, headers=AUTH)
        check(r.status_code == 413, "oversized body: 413")
        r = await h.post(url, json=obligation("http-unauth"))
        check(r.status_code == 401 and r.json()["error"]["code"] == "unauthenticated",
              "unauthenticated: 401")
        r = await h.post(url, json=obligation("http-unauth"), headers={"Authorization": "Bearer nope"})
        check(r.status_code == 401, "wrong credential: 401")
        ack_url = f"{base}/abhyasa/custody_ack"
        r = await h.post(ack_url, json={"obligation_id": "x", "target": "alice",
                                         "status": "applied", "acked_at": now()}, headers=AUTH)
        check(r.status_code == 204, "POST custody_ack: 204")
        r = await h.post(ack_url, json={"obligation_id": "x", "target": "alice",
                                         "status": "maybe", "acked_at": now()}, headers=AUTH)
        check(r.status_code == 400 and r.json()["error"]["field"] == "status",
              "malformed ack: 400 naming status")
        r = await h.post(ack_url, json={"obligation_id": "x"})
        check(r.status_code == 401, "unauthenticated ack: 401")
        r = await h.post(base, json={"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
                                      "params": {}},
                         headers=AUTH | {"A2A-Version": "7.0"})
        check(r.json()["error"]["code"] == -32009, "unsupported A2A-Version: -32009")


async def main(binary):
    sink = http.server.ThreadingHTTPServer(("127.0.0.1", 0), AckSink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    ack_endpoint = f"http://127.0.0.1:{sink.server_address[1]}/abhyasa/custody_ack"
    proc = subprocess.Popen([binary, "--ack-endpoint", ack_endpoint, "--token", TOKEN],
                            stdout=subprocess.PIPE, text=True)
    lines = []
    try:
        first = proc.stdout.readline().split()
        check(first[:1] == ["listening"], "receiver started")
        base = first[1]
        reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")),
                                  daemon=True)
        reader.start()
        await sdk_checks(base, {})
        await httpx_checks(base)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
    applied = [l.split()[2] for l in lines if l.startswith("applied ")]
    check(applied.count("sdk-applied") == 1, "redelivery not re-applied (applied once)")
    check("sdk-declined" not in applied and "http-unauth" not in applied,
          "declined and unauthenticated never applied")
    check(applied.count("sdk-deferred") == 1 and applied.count("http-deferred") == 1,
          "deferred ones applied once, after the deferral")
    print("all A2A client checks passed")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
