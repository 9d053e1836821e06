#!/usr/bin/env python3
"""An in-memory stand-in for the a4sx HTTP API, for a4sx-mcp's tests and an offline demo.

Stdlib only (Python 3.9+), bound to 127.0.0.1, synthetic data only. Every request is recorded in
``Stub.log`` so tests can assert on exactly what was sent (including that no billing or purchase
route was ever called), and canned answers can be queued per route to simulate busy servers, lost
answers, slow, trickled, stalled or flooding answers, redirects and broken bodies. It speaks
HTTP/1.1 with keep-alive (``close_each=True``: one answer per connection, as HTTP/1.0 servers do),
counts the connections it accepts (``Stub.connections``) and ends (``Stub.closed``), closes
connections idle longer than ``idle_close`` seconds, and serves TLS when given a server
``ssl.SSLContext``.

    python stub_server.py [--port N] [--token-file PATH]   # serve an empty API
    python stub_server.py --demo [--port N] [--state DIR] [--reset]   # a small synthetic marketplace

The demo listens on 127.0.0.1:8787 (``DEMO_PORT``) by default and keeps its token, the MCP server's config folder and
the library (what you save or acquire) in ``--state`` (default ``~/.a4sx-demo``), so the client
configuration it prints stays the same across restarts; ``--reset`` starts the library over.
"""

import argparse
import base64
import copy
import hashlib
import json
import os
import secrets
import shlex
import signal
import socket
import sys
import threading
import time
import uuid
from collections import defaultdict, deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, unquote, urlsplit

HOST = "127.0.0.1"
MAX_BODY = 64 * 1024 * 1024
KNOWN_HARNESSES = ("claude-code", "codex-cli", "gemini-cli", "opencode", "grok-build")

# (method, exact path) -> route key. The acquire route carries an id and is matched by prefix.
_ROUTES = {
    ("GET", "/memory/discover"): "GET /memory/discover",
    ("GET", "/memory/discover/item"): "GET /memory/discover/item",
    ("GET", "/library/sessions"): "GET /library/sessions",
    ("GET", "/library/fetch"): "GET /library/fetch",
    ("POST", "/library/ensure"): "POST /library/ensure",
    ("POST", "/library/push"): "POST /library/push",
    ("GET", "/healthz"): "GET /healthz",
    ("GET", "/accounts/me"): "GET /accounts/me",
}
_ACQUIRE_PREFIX = "/library/acquire/"


def _err(code, message=None, details=None):
    """The current error envelope."""
    e = {"code": code, "message": message or code.replace("_", " ")}
    if details is not None:
        e["details"] = details
    return {"error": e}


def _now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _harness_id(value):
    """A harness id as the API compares it: a string or {id}, trimmed and lower-cased; else unknown."""
    if isinstance(value, dict):
        value = value.get("id")
    hid = value.strip().lower() if isinstance(value, str) else ""
    return hid if hid in KNOWN_HARNESSES else "unknown"


def _split_list(value):
    return [p.strip().lower() for p in (value or "").split(",") if p.strip()]


def _int(value, default):
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return default


# -- data builders for tests --------------------------------------------------------------------

def claude_record(role, text, session_id="s-1", **extra):
    """One Claude Code JSONL record; ``text`` may be a string or a list of content blocks."""
    rec = {"type": role, "sessionId": session_id, "uuid": str(uuid.uuid4()),
           "message": {"role": role, "content": text}}
    rec.update(extra)
    return rec


def claude_jsonl(records):
    """Records as JSONL bytes (one JSON object per line, trailing newline)."""
    return ("\n".join(json.dumps(r) for r in records) + "\n").encode("utf-8")


def bundle(cid, files, title="t", version="1", kind="session", extra_members=(), harness=None):
    """A ``/library/fetch`` bundle with one member holding ``files`` (path -> bytes or str)."""
    enc = [{"path": p, "content_b64": base64.b64encode(c.encode("utf-8") if isinstance(c, str) else c).decode("ascii")}
           for p, c in files.items()]
    b = {"id": cid, "title": title, "version": version,
         "members": [{"kind": kind, "id": cid, "files": enc}] + list(extra_members)}
    if harness is not None:
        b["harness"] = harness
    return b


def canonical_doc(turns, harness="codex-cli"):
    """A harness-neutral ``canonical.json`` (format a4sx.session/0.1) as bytes."""
    return json.dumps({"format": "a4sx.session/0.1", "harness": {"id": harness, "version": "0.130.2"},
                       "turns": turns}).encode("utf-8")


def _defaults(base, fields):
    """``base`` updated with ``fields``; a field given as None removes the key (an absent field)."""
    base.update(fields)
    return {k: v for k, v in base.items() if v is not None}


def listing(id, **fields):
    """A marketplace listing row with synthetic defaults."""
    return _defaults({
        "id": id, "tenant": "acme", "version": "1", "title": "Session " + id,
        "description": "A synthetic session used for testing.", "abstract": "Synthetic abstract.",
        "tags": ["demo"], "author_handle": "demo-author", "owner": "demo-author",
        "price_cents": 0, "currency": "USD", "has_transcript": True,
        "harness": {"id": "claude-code", "version": "2.1.3"},
        "created_at": "2025-01-01T00:00:00Z", "stats": {},
    }, fields)


def library_row(id, **fields):
    """A library row with synthetic defaults (no parent, not acquired)."""
    return _defaults({
        "id": id, "label": id, "title": "Library session " + id, "description": "A synthetic saved session.",
        "summary": "Synthetic summary.", "tags": [], "created_at": "2025-01-01T00:00:00Z",
        "updated_at": "2025-01-01T00:00:00Z", "version": "1", "versions": 1, "tokens": 1200,
        "sessions": 1, "harness": "claude-code",
    }, fields)


# -- HTTP plumbing ------------------------------------------------------------------------------

class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def get_request(self):
        """Counts each connection; TLS is wrapped here, its handshake done in the handler's thread."""
        sock, addr = self.socket.accept()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # headers and body: no Nagle wait
        with self.stub._lock:
            self.stub.connections += 1
        if self.stub.tls is not None:
            sock = self.stub.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    def shutdown_request(self, request):
        """A connection's end (the client's, an idle close, ``close_each``): counted once it is closed."""
        super().shutdown_request(request)
        with self.stub._lock:
            self.stub.closed += 1

    def handle_error(self, request, client_address):
        """Clients that hang up mid-answer (timeouts in tests) are normal; stay quiet."""
        if self.stub.verbose:
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # kept alive unless the stub closes after each answer
    server_version = "a4sx-stub"

    def setup(self):
        super().setup()
        self.connection.settimeout(self.server.stub.idle_close)
        if self.server.stub.tls is not None:
            try:
                self.connection.do_handshake()
            except (OSError, ValueError):
                self.close_connection = True  # the first read fails too, and the connection ends

    def handle_one_request(self):
        try:
            super().handle_one_request()
        except (OSError, ValueError):  # a client gone, an idle connection timed out
            self.close_connection = True

    def log_message(self, fmt, *args):
        if self.server.stub.verbose:
            super().log_message(fmt, *args)

    def _handle(self):
        self.server.stub._dispatch(self)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _handle


class Stub:
    """The fake API. State is plain attributes that tests may edit directly between requests."""

    def __init__(self, port=0, *, verbose=False, tls=None, close_each=False, idle_close=None):
        self.verbose = verbose
        self.tls, self.close_each, self.idle_close = tls, close_each, idle_close
        self.connections = 0
        self.closed = 0
        self._stop_event = threading.Event()
        self.tokens = set()
        self.listings = {}
        self.entitled = set()
        self.library = []
        self.bundles = {}
        self.log = []
        self.pushes = []
        self._encoded = {}                   # id(bundle) -> (bundle, JSON bytes), large bundles only
        self._idem = {}                      # Idempotency-Key -> (status, body)
        self._queues = defaultdict(deque)    # route key -> canned answers
        self._lock = threading.RLock()
        self._stopped = False
        self.state_file = None               # the demo's library between runs (save_state, load_state)
        self._server = _Server((HOST, port), _Handler)
        self._server.stub = self
        self.port = self._server.server_address[1]
        self.base = "%s://%s:%d" % ("https" if tls else "http", HOST, self.port)
        self._thread = threading.Thread(target=self._server.serve_forever, name="a4sx-stub", daemon=True)
        self._thread.start()

    # -- lifecycle ------------------------------------------------------------------------------

    def stop(self):
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self._stop_event.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def __repr__(self):  # never shows tokens
        return "<Stub %s>" % self.base

    # -- test helpers ---------------------------------------------------------------------------

    def new_token(self):
        """Make a random bearer token (built at run time), accept it, and return it."""
        tok = "stub-" + secrets.token_hex(12)
        self.tokens.add(tok)
        return tok

    def requests(self, route=None):
        with self._lock:
            return [dict(r) for r in self.log if route is None or r["route"] == route]

    def queue(self, route, status=200, body=None, *, delay=0.0, drop=False, redirect=None, headers=None,
              store=False, raw=None, cut=False, trickle=0.0, stall=False, flood=None, announce=True, hold=None,
              gate=None):
        """Queue one canned answer for ``route`` (FIFO). ``status=None`` with ``delay`` gives the
        normal answer, late. ``cut`` (or ``headers={"X-Cut": "1"}``) announces 100 bytes more than
        it sends, then closes. ``store`` (push only) stores the push, then answers with the canned one.
        ``trickle``: the body one byte per that many seconds. ``stall``: headers, then nothing until
        the client hangs up or the stub stops. ``flood=(head, unit, count, tail)``: a body of
        ``head + unit * count + tail`` streamed without building it; ``announce=False`` sends no
        Content-Length (the body ends when the connection closes). ``hold``: a ``threading.Event`` the
        answer waits for (at most 60 s) once the request is read and, with ``store`` or
        ``status=None``, stored: an upload held until the test releases it. ``gate``: a
        ``threading.Event`` the request waits for (at most 60 s) before anything else is done with it:
        an answer late by as long as the test wants, stored (if at all) only then."""
        with self._lock:
            self._queues[route].append(dict(status=status, body=body, delay=delay, drop=drop, redirect=redirect,
                                            headers=dict(headers or {}), store=store, raw=raw, cut=cut,
                                            trickle=trickle, stall=stall, flood=flood, announce=announce,
                                            hold=hold, gate=gate))

    def clear_queue(self):
        with self._lock:
            self._queues.clear()

    # -- dispatch -------------------------------------------------------------------------------

    def _bundle_bytes(self, b):
        """A bundle as JSON bytes. A large one (a benchmark's 20 MB session) is encoded once and
        reused while the same object is served, so the stub's own work does not dominate a timing."""
        cached = self._encoded.get(id(b))
        if cached is not None and cached[0] is b:
            return cached[1]
        data = json.dumps(b).encode("utf-8")
        if len(data) > 1024 * 1024:
            self._encoded[id(b)] = (b, data)
        return data

    def _route_of(self, method, path):
        if method == "POST" and path.startswith(_ACQUIRE_PREFIX):
            return "POST /library/acquire"
        return _ROUTES.get((method, path), "%s %s" % (method, path))

    def _dispatch(self, h):
        parts = urlsplit(h.path)
        path = parts.path or "/"
        query = dict(parse_qsl(parts.query, keep_blank_values=True))  # last value wins
        headers = {k.lower(): v for k, v in h.headers.items()}
        route = self._route_of(h.command, path)
        rec = {"method": h.command, "path": path, "query": query, "headers": headers, "body": b"",
               "route": route, "status": None}
        with self._lock:
            self.log.append(rec)  # arrival order, before the body is read
        try:
            length = int(headers.get("content-length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY:
            code = "bad_request" if length < 0 else "too_large"
            return self._send(h, rec, 400 if length < 0 else 413, _err(code), canned={"close": True})
        rec["body"] = h.rfile.read(length) if length else b""
        with self._lock:
            q = self._queues.get(route)
            canned = q.popleft() if q else None
        if canned is None:
            status, body = self._answer(rec, route, path, query, headers)
            return self._send(h, rec, status, body)
        if canned["gate"] is not None:
            canned["gate"].wait(60)
        if canned["delay"]:
            time.sleep(canned["delay"])
        if canned["drop"]:
            h.close_connection = True  # nothing written: the client sees the connection close
            return None
        if canned["store"] or canned["status"] is None:
            status, body = self._answer(rec, route, path, query, headers)
            if canned["hold"] is not None:
                canned["hold"].wait(60)
            if canned["status"] is None:
                return self._send(h, rec, status, body)
        extra = dict(canned["headers"])
        status = canned["status"]
        if canned["redirect"]:
            status = 302 if status == 200 else status
            extra["Location"] = canned["redirect"]
        payload = canned["raw"] if canned["raw"] is not None else canned["body"]
        if payload is None:
            payload = {}
        cut = canned["cut"] or extra.get("X-Cut") == "1"
        if canned["flood"] is not None:
            return self._flood(h, rec, status, canned["flood"], canned["announce"])
        return self._send(h, rec, status, payload, extra, cut, canned)

    def _send(self, h, rec, status, body, headers=None, cut=False, canned=None):
        """Write one answer: JSON unless ``body`` is bytes or str (sent verbatim)."""
        if isinstance(body, str):
            data = body.encode("utf-8")
        elif isinstance(body, (bytes, bytearray)):
            data = bytes(body)
        else:
            data = json.dumps(body).encode("utf-8")
        headers = dict(headers or {})
        ctype = headers.pop("Content-Type", None) or headers.pop("content-type", None) or "application/json"
        canned = canned or {}
        close = bool(cut or self.close_each or canned.get("announce") is False or canned.get("close"))
        rec["status"] = status  # set before writing, so a client that got the answer sees it logged
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        if canned.get("announce", True):
            h.send_header("Content-Length", str(len(data) + (100 if cut else 0)))
        if close:
            h.send_header("Connection", "close")
        for k, v in headers.items():
            h.send_header(k, v)
        h.end_headers()
        h.close_connection = close or h.close_connection  # the client may have asked to close
        if h.command == "HEAD":
            return h.wfile.flush()
        if canned.get("stall"):
            h.wfile.flush()
            self._stop_event.wait(60)
            h.close_connection = True
            return None
        if canned.get("trickle"):
            for i in range(len(data)):
                h.wfile.write(data[i:i + 1])
                h.wfile.flush()
                if self._stop_event.wait(canned["trickle"]):
                    break
            return None
        h.wfile.write(data)
        h.wfile.flush()
        return None

    def _flood(self, h, rec, status, flood, announce):
        """A huge body streamed from its parts, never built whole."""
        head, unit, count, tail = flood
        rec["status"] = status
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        if announce:
            h.send_header("Content-Length", str(len(head) + len(unit) * count + len(tail)))
        h.send_header("Connection", "close")
        h.end_headers()
        h.close_connection = True
        h.wfile.write(head)
        block = unit * max(1, (1 << 20) // max(1, len(unit)))
        per_block = len(block) // len(unit)
        left = count
        while left > 0:
            n = min(left, per_block)
            h.wfile.write(block if n == per_block else unit * n)
            left -= n
        h.wfile.write(tail)
        h.wfile.flush()

    def _auth(self, headers):
        """None when the bearer is accepted, else the 401 answer."""
        value = headers.get("authorization")
        if not value:
            return 401, _err("auth_missing", "sign in required")
        scheme, _, tok = value.partition(" ")
        if scheme.lower() != "bearer" or tok.strip() not in self.tokens:
            return 401, _err("auth_invalid", "session expired or revoked")
        return None

    def _answer(self, rec, route, path, query, headers):
        """The normal (uncanned) answer for one request: (status, body)."""
        with self._lock:
            if route == "GET /healthz":
                return 200, {"ok": True, "version": "stub"}
            if route == "GET /memory/discover":
                if "authorization" in headers:
                    return 403, _err("library_token_read_only", "public search is anonymous; do not send a token")
                return 200, self._discover(query)
            if route == "GET /memory/discover/item":
                item = self.listings.get(query.get("id", ""))
                t = query.get("t")
                if item is None or (t and item.get("tenant") and item.get("tenant") != t):
                    return 404, _err("collection_not_found", "no such listing")
                return 200, {"item": self._public(item)}
            if route not in ("POST /library/acquire",) and route not in _ROUTES.values():
                return 404, _err("not_found", "no route for %s %s" % (rec["method"], path))
            denied = self._auth(headers)
            if denied:
                return denied
            if route == "GET /accounts/me":
                return 200, {"user": {"handle": "demo"}}
            if route == "GET /library/sessions":
                return 200, {"sessions": copy.deepcopy(self.library)}
            if route == "GET /library/fetch":
                cid, ver = query.get("cid", ""), query.get("version")
                b = self.bundles.get((cid, ver)) if ver else None
                b = b or self.bundles.get(cid)
                if b is None:
                    return 404, _err("not_found", "no such saved session")
                return 200, self._bundle_bytes(b)
            if route == "POST /library/ensure":
                return 200, {"ok": True}
            if route == "POST /library/acquire":
                return self._kept(self._acquire(unquote(path[len(_ACQUIRE_PREFIX):]), query))
            return self._kept(self._push(rec, query, headers))

    # -- the demo's library between runs --------------------------------------------------------

    def _kept(self, answer):
        """``answer``, after writing the library to ``state_file`` when it changed (the demo only)."""
        if self.state_file and answer[0] == 201:
            self.save_state()
        return answer

    def save_state(self):
        """The library, its bundles and what was pushed (for deduplication), as JSON, replaced whole."""
        with self._lock:
            state = {"library": self.library, "entitled": sorted(self.entitled),
                     "bundles": [[k if isinstance(k, str) else list(k), b] for k, b in self.bundles.items()
                                 if (k if isinstance(k, str) else k[0]) in {r["id"] for r in self.library}],
                     "pushes": [{k: v for k, v in p.items() if k != "body"} for p in self.pushes]}
            temporary = self.state_file + ".tmp"
            with open(temporary, "w", encoding="utf-8") as f:
                json.dump(state, f)
            os.replace(temporary, self.state_file)

    def load_state(self):
        """The library a previous run saved in ``state_file``; False when there is none."""
        try:
            with open(self.state_file, encoding="utf-8") as f:
                state = json.load(f)
        except FileNotFoundError:
            return False
        with self._lock:
            self.library[:] = state["library"]
            self.entitled = set(state["entitled"])
            self.bundles.update((k if isinstance(k, str) else tuple(k), b) for k, b in state["bundles"])
            self.pushes[:] = [dict(p, body=b"") for p in state["pushes"]]
        return True

    # -- routes ---------------------------------------------------------------------------------

    @staticmethod
    def _public(item):
        """A listing as the API shows it: keys starting with "_" are stub-only."""
        return {k: copy.deepcopy(v) for k, v in item.items() if not str(k).startswith("_")}

    def _discover(self, query):
        q = query.get("q", "").strip().lower()
        tags = _split_list(query.get("tag"))
        harn = set(_split_list(query.get("harness")))
        rows = []
        for item in self.listings.values():
            hay = " ".join(str(item.get(k) or "") for k in ("id", "title", "description", "abstract")).lower()
            itags = {str(t).lower() for t in item.get("tags") or []}
            if q and q not in hay:
                continue
            if any(t not in itags for t in tags):
                continue
            if harn and _harness_id(item.get("harness")) not in harn:
                continue
            rows.append(item)
        sort = query.get("sort", "relevance")
        if sort == "recent":
            rows.sort(key=lambda r: str(r.get("created_at") or ""), reverse=True)
        elif sort in ("imports", "rating"):
            rows.sort(key=lambda r: (r.get("stats") or {}).get(sort) or 0, reverse=True)
        limit, offset = _int(query.get("limit"), 10), _int(query.get("offset"), 0)
        page = rows[offset:offset + limit]
        more = offset + len(page) < len(rows)
        return {"query": query.get("q", ""), "items": [self._public(r) for r in page], "total": len(rows),
                "next_offset": offset + len(page) if more else None}

    def _acquire(self, lid, query):
        item = self.listings.get(lid)
        tenant = query.get("tenant") or (item or {}).get("tenant")
        if item is None or (item.get("tenant") and tenant != item.get("tenant")):
            return 404, _err("collection_not_found", "no such listing")
        if item.get("kind") == "memory":
            return 409, _err("memory_only", "this listing is reading material, not a session")
        if (item.get("price_cents") or 0) > 0 and lid not in self.entitled:
            details = {"id": lid, "tenant": tenant, "price_cents": item.get("price_cents"),
                       "currency": item.get("currency")}
            if isinstance(item.get("member"), dict):
                details["member"] = dict(item["member"])
            return 402, _err("payment_required", "buy this listing on its page first", details)
        cid = "lib-" + secrets.token_hex(4)
        acquired_from = {"id": lid, "tenant": tenant}
        self.library.append(library_row(
            cid, label=cid, title=item.get("title"), description=item.get("description"),
            summary=item.get("abstract"), tags=list(item.get("tags") or []), harness=item.get("harness"),
            created_at=_now(), updated_at=_now(), acquired_from=acquired_from))
        if lid in self.bundles:
            b = copy.deepcopy(self.bundles[lid])
            b["id"] = cid
            self.bundles[cid] = b
        return 201, {"collection": cid, "session": "s-" + secrets.token_hex(4), "version": "1",
                     "acquired_from": acquired_from}

    def _push(self, rec, query, headers):
        body = rec["body"]
        sha = hashlib.sha256(body).hexdigest()
        claimed = headers.get("x-content-sha256")
        if claimed and claimed.strip().lower() != sha:
            return 400, _err("content_sha_mismatch", "X-Content-SHA256 does not match the body")
        key = headers.get("idempotency-key")
        if key and key in self._idem:
            status, answer = self._idem[key]
            return status, copy.deepcopy(answer)
        label, title = query.get("label") or None, query.get("title") or None
        first = _first_record(body)
        harness = "codex-cli" if isinstance(first, dict) and first.get("type") == "session_meta" else "claude-code"
        parent = None
        if query.get("parent"):
            pc, at, pv = query["parent"].rpartition("@")
            parent = {"cid": pc, "version": pv} if at and pc else {"cid": query["parent"], "version": None}
        into = query.get("into")
        row = next((r for r in self.library if into and r.get("id") == into), None) or \
            next((r for r in self.library if label and r.get("label") == label), None)
        latest = next((p for p in reversed(self.pushes) if row and p["collection"] == row["id"]), None)
        if row is not None and latest is not None and latest["sha256"] == sha:
            answer = {"collection": row["id"], "version": str(row.get("version")), "deduped": True}
        else:
            if row is None:
                cid = "lib-" + secrets.token_hex(4)
                row = library_row(cid, label=label or cid, title=title or "Untitled session", versions=0,
                                  created_at=_now(), tags=[], description="", summary="")
                self.library.append(row)
            row["versions"] = int(row.get("versions") or 0) + 1
            row["version"] = str(row["versions"])
            row["updated_at"] = _now()
            row["harness"] = harness
            row["tokens"] = len(body) // 4
            if title:
                row["title"] = title
            if parent:
                row["parent"] = parent
            cid, ver = row["id"], row["version"]
            self.pushes.append({"collection": cid, "version": ver, "body": body, "query": dict(query),
                                "idempotency_key": key, "sha256": sha})
            name = "transcript.jsonl" if harness == "claude-code" else "native/codex-cli.jsonl"
            b = bundle(cid, {name: body}, title=row.get("title") or "", version=ver)
            self.bundles[cid] = b
            self.bundles[(cid, ver)] = copy.deepcopy(b)
            answer = {"collection": cid, "version": ver, "deduped": False}
        answer.update({"redactions": {}, "parent": parent, "harness": {"id": harness, "version": None}})
        if key:
            self._idem[key] = (201, copy.deepcopy(answer))
        return 201, answer


def _first_record(body):
    """The first non-blank JSONL line, parsed; None when it is not JSON."""
    for line in body.split(b"\n"):
        if line.strip():
            try:
                return json.loads(line.decode("utf-8", "replace"))
            except ValueError:
                return None
    return None


# -- demo data ----------------------------------------------------------------------------------

def _demo_tool_session(session_id, ask, plan, tool, tool_input, output, answer):
    """A short Claude Code session: a question, one tool_use / tool_result round trip, the answer."""
    tool_id = "toolu_demo_" + secrets.token_hex(4)
    return claude_jsonl([
        claude_record("user", ask, session_id),
        claude_record("assistant", [{"type": "text", "text": plan},
                                    {"type": "tool_use", "id": tool_id, "name": tool, "input": tool_input}], session_id),
        claude_record("user", [{"type": "tool_result", "tool_use_id": tool_id, "content": output}], session_id),
        claude_record("assistant", answer, session_id),
    ])


def _demo_claude_transcript(session_id):
    """Renaming a helper across a project."""
    return _demo_tool_session(
        session_id, "Rename the helper parse_cfg to parse_config across the demo project.",
        "I'll find every call site first.", "Grep", {"pattern": "parse_cfg"},
        "src/app.py:12:    cfg = parse_cfg(path)\nsrc/cfg.py:3:def parse_cfg(p):",
        "Renamed the definition in src/cfg.py and the call in src/app.py; the tests still pass.")


def _demo_codex_files():
    """A Codex CLI session: its native rollout plus the harness-neutral canonical form."""
    native = [{"timestamp": "2026-11-02T09:00:0%dZ" % i, "ordinal": i, **record} for i, record in enumerate([
        {"type": "session_meta", "payload": {"id": str(uuid.uuid4()), "cli_version": "0.130.2", "cwd": "/tmp/demo"}},
        {"type": "response_item", "payload": {"type": "message", "role": "user",
                                              "content": [{"type": "input_text", "text": "Why does CI fail on lint?"}]}},
        {"type": "response_item", "payload": {"type": "function_call", "name": "shell", "call_id": "call_1",
                                              "arguments": json.dumps({"command": ["ruff", "check", "."]})}},
        {"type": "response_item", "payload": {"type": "function_call_output", "call_id": "call_1",
                                              "output": "src/util.py:4:1: F401 'os' imported but unused"}},
        {"type": "response_item", "payload": {"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": "An unused import in src/util.py; removing it fixes the lint job."}]}},
    ])]
    turns = [
        {"role": "user", "content": [{"type": "text", "text": "Why does CI fail on lint?"}]},
        {"role": "assistant", "content": [{"type": "tool_call", "name": "shell",
                                           "args": {"command": ["ruff", "check", "."]}}]},
        {"role": "tool", "content": [{"type": "tool_result",
                                      "content": "src/util.py:4:1: F401 'os' imported but unused"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "An unused import in src/util.py; "
                                                                   "removing it fixes the lint job."}]},
    ]
    return {"canonical.json": canonical_doc(turns), "native/codex-cli.jsonl": claude_jsonl(native)}  # any JSONL


def _demo_flaky_transcript(session_id):
    """A flaky pytest fixture (the README's example request)."""
    return _demo_tool_session(
        session_id, "test_orders passes alone but fails in the full run. Is a pytest fixture leaking?",
        "Let me run the suite in a random order to find the leak.", "Bash", {"command": "pytest -p random_order -x"},
        "FAILED tests/test_orders.py::test_total - assert 3 == 2",
        "The module-scoped `db` fixture keeps rows between tests; making it function-scoped with a rollback "
        "fixes the flaky test.")


def seed_demo(stub, token=None):
    """Fill ``stub`` with a small synthetic marketplace and library that answer the README's example
    requests; accept ``token`` (default: a fresh one) and return it."""
    codex = {"id": "codex-cli", "version": "0.130.2"}
    free_files = {"transcript.jsonl": _demo_claude_transcript("demo-free-1"),
                  "SESSION.md": b"# Rename a helper\n\nA short synthetic refactoring session.\n"}
    with stub._lock:
        stub.listings["demo-free-refactor"] = listing(
            "demo-free-refactor", title="Rename a helper across a project",
            description="A free Claude Code session: find call sites, rename, run tests.",
            abstract="Grep, edit, test.", tags=["refactor", "python"], created_at="2025-03-01T10:00:00Z",
            stats={"imports": 42, "rating": 4.6}, outline=["Find call sites", "Rename", "Run tests"])
        stub.listings["demo-flaky-fixtures"] = listing(
            "demo-flaky-fixtures", title="Fixing flaky pytest fixtures",
            description="A free Claude Code session: flaky pytest fixtures that leak state between tests, "
                        "found with a random test order and fixed with a function-scoped fixture.",
            abstract="Random order, a leaking module-scoped fixture, a rollback.",
            tags=["pytest", "testing", "python"],
            created_at="2025-06-01T10:00:00Z", stats={"imports": 58, "rating": 4.8},
            outline=["Reproduce in a random order", "Find the leaking fixture", "Scope it per test"])
        stub.bundles["demo-flaky-fixtures"] = bundle(
            "demo-flaky-fixtures", {"transcript.jsonl": _demo_flaky_transcript("demo-flaky-1")},
            title="Fixing flaky pytest fixtures")
        stub.listings["demo-paid-migration"] = listing(
            "demo-paid-migration", title="Postgres 12 to 16 migration playbook", price_cents=1900,
            description="A paid Claude Code session walking through a database upgrade.",
            abstract="Dump, upgrade, verify.", tags=["database", "migration"], created_at="2025-04-12T09:00:00Z",
            stats={"imports": 7, "rating": 4.9})
        stub.listings["demo-paid-pack"] = listing(
            "demo-paid-pack", title="Frontend testing pack", price_cents=2900,
            description="A pack whose session is sold separately.", abstract="Reading notes plus a session.",
            tags=["testing", "frontend"], created_at="2025-02-20T08:00:00Z", stats={"imports": 3},
            member={"kind": "session", "id": "demo-paid-pack-session"},
            members=[{"id": "demo-paid-pack-session", "kind": "session", "title": "Playwright setup",
                      "abstract": "Setting up end-to-end tests."}])
        stub.listings["demo-codex-lint"] = listing(
            "demo-codex-lint", title="Fix a failing lint job", harness=codex,
            description="A free Codex CLI session (loadable as context, not resumable in Claude Code).",
            abstract="ruff, one unused import.", tags=["ci", "python"], created_at="2025-05-02T12:00:00Z",
            stats={"imports": 11, "rating": 4.2})
        stub.bundles["demo-free-refactor"] = bundle("demo-free-refactor", free_files,
                                                    title="Rename a helper across a project")
        stub.bundles["demo-codex-lint"] = bundle("demo-codex-lint", _demo_codex_files(),
                                                 title="Fix a failing lint job", harness=codex)

        stub.library.append(library_row(
            "lib-demo-cc", label="my-refactor", title="My refactoring session",
            description="Renaming a helper in my project.", tags=["refactor"],
            harness={"id": "claude-code", "version": "2.1.3"}, updated_at="2025-05-10T08:00:00Z"))
        stub.bundles["lib-demo-cc"] = bundle(
            "lib-demo-cc", {"transcript.jsonl": _demo_claude_transcript("demo-own-1")},
            title="My refactoring session")
        stub.library.append(library_row(
            "lib-demo-codex", label="lint-fix", title="Lint fix with Codex", harness="codex-cli",
            description="Codex CLI session fixing CI lint.", tags=["ci"], updated_at="2025-05-11T08:00:00Z"))
        stub.bundles["lib-demo-codex"] = bundle("lib-demo-codex", _demo_codex_files(),
                                                title="Lint fix with Codex", harness=codex)
        stub.library.append(library_row(
            "lib-demo-acquired", label="lib-demo-acquired", title="Rename a helper across a project",
            description="Copied from the marketplace.", tags=["refactor", "python"],
            acquired_from={"id": "demo-free-refactor", "tenant": "acme"}, updated_at="2025-05-12T08:00:00Z"))
        stub.bundles["lib-demo-acquired"] = bundle("lib-demo-acquired", free_files,
                                                   title="Rename a helper across a project")
        token = token or "demo-" + secrets.token_hex(8)
        stub.tokens.add(token)
    return token


DEMO_PORT = 8787
DEMO_STATE = os.path.join("~", ".a4sx-demo")


def demo_state(folder, reset):
    """The demo's folder (created 0700): its token (made once), the config folder the MCP server gets
    (``config``) and the file that keeps the library (``library.json``; ``reset`` removes it)."""
    folder = os.path.abspath(os.path.expanduser(folder))
    config = os.path.join(folder, "config")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.makedirs(config, mode=0o700, exist_ok=True)
    library = os.path.join(folder, "library.json")
    if reset and os.path.exists(library):
        os.remove(library)
    token_file = os.path.join(folder, "token")
    try:
        with open(token_file, encoding="utf-8") as f:
            token = f.read().strip()
    except FileNotFoundError:
        token = ""
    if not token:
        token = "demo-" + secrets.token_hex(8)
        with open(os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as f:
            f.write(token + "\n")
    return folder, config, library, token


def _print_demo(stub, token, config_dir, folder=None, kept=False):
    """The environment and MCP client config a user needs to try the demo: the same on every start
    with the same ``--port`` and ``--state``."""
    env = {"A4SX_BASE": stub.base, "A4SX_SESSION": token, "A4SX_SESSION_BASE": stub.base,
           "A4SX_CONFIG_DIR": config_dir}
    server = os.path.join(os.path.dirname(os.path.abspath(__file__)), "a4sx_mcp.py")
    print("# a4sx demo API on %s (synthetic data; Ctrl-C to stop)" % stub.base)
    if folder:
        print("# Library %s %s (--reset starts it over)"
              % ("reused from" if kept else "kept in", os.path.join(folder, "library.json")))
        print("# Start it again with the same --port and --state: this configuration stays valid")
    print("# Environment for a4sx-mcp:")
    for k, v in env.items():
        print("export %s=%s" % (k, shlex.quote(v)))
    print("# MCP client config:")
    print(json.dumps({"mcpServers": {"a4sx-demo": {"command": sys.executable, "args": [server], "env": env}}},
                     indent=2))
    ids = [row["id"] for row in stub.library]
    print("# Pick a library session yourself (server name a4sx-demo):")
    print("#   Claude Code: /mcp__a4sx-demo__load_session %s   or   @a4sx-demo:a4sx://library/%s" % (ids[0], ids[0]))
    print("#   VS Code: /mcp.a4sx-demo.load_session, or Add Context > MCP Resources > a4sx-demo")
    print("#   prompts: load_session, find_sessions, save_session; resources: %s"
          % ", ".join("a4sx://library/" + i for i in ids))
    print('# Then ask your agent: "Search a4sx for sessions about flaky pytest fixtures and summarise the best one",')
    print('#   or "Load my a4sx session my-refactor as context"')
    sys.stdout.flush()


def main(argv=None):
    ap = argparse.ArgumentParser(description="In-memory stand-in for the a4sx API on 127.0.0.1.")
    ap.add_argument("--port", type=int, default=None,
                    help="port to listen on (0 = pick a free one; default %d with --demo, else 0)" % DEMO_PORT)
    ap.add_argument("--demo", action="store_true", help="seed a synthetic marketplace and library")
    ap.add_argument("--state", default=DEMO_STATE,
                    help="with --demo: the folder that keeps its token, config folder and library between runs "
                         "(default %s)" % DEMO_STATE)
    ap.add_argument("--reset", action="store_true", help="with --demo: start the library over")
    ap.add_argument("--token-file", help="accept the token stored in this file")
    ap.add_argument("--verbose", action="store_true", help="log every request to stderr")
    args = ap.parse_args(argv)
    port = args.port if args.port is not None else DEMO_PORT if args.demo else 0
    try:
        stub = Stub(port=port, verbose=args.verbose)
    except OSError as err:
        sys.exit("stub_server: cannot listen on %s:%d (%s); is a demo already running? Choose another port with "
                 "--port N (and use the configuration it prints)." % (HOST, port, err.strerror or err))
    if args.token_file:
        with open(args.token_file, encoding="utf-8") as f:
            tok = f.read().strip()
        if tok:
            stub.tokens.add(tok)
    print("stub a4sx API on %s" % stub.base, file=sys.stderr, flush=True)
    if args.demo:
        folder, config, stub.state_file, token = demo_state(args.state, args.reset)
        seed_demo(stub, token)
        try:
            kept = stub.load_state()
        except (ValueError, KeyError, TypeError):
            stub.stop()
            sys.exit("stub_server: %s is not a library this demo saved; start with --reset to start it over"
                     % stub.state_file)
        _print_demo(stub, token, config, folder, kept)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # `kill` stops it as cleanly as Ctrl-C
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        stub.stop()


if __name__ == "__main__":
    main()
