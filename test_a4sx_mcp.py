# SPDX-License-Identifier: Apache-2.0
"""Tests for a4sx-mcp, through its real interfaces: a spawned server spoken to over its stdio pipes,
tools run against ``stub_server.py`` on 127.0.0.1. Offline: a guard fails any test that resolves or
connects to a non-loopback address, in this process and in every server process it spawns.

Run: ``pytest -q`` (the long soak tests are marked ``soak``; ``pytest -q -m 'not soak'`` skips them).
"""

import base64
import hashlib
import json
import os
import queue
import random
import re
import secrets
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import a4sx_mcp
import stub_server
from stub_server import Stub, bundle, canonical_doc, claude_jsonl, claude_record, library_row, listing

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "a4sx_mcp.py")
TOOL_NAMES = ["search_sessions", "get_session_summary", "acquire_session", "fetch_session_context", "publish_session"]
LEGACY = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"]
MODERN = "2026-07-28"
MODERN_META = {"io.modelcontextprotocol/protocolVersion": MODERN,
               "io.modelcontextprotocol/clientCapabilities": {},
               "io.modelcontextprotocol/clientInfo": {"name": "tests", "version": "0"}}


# ---------------------------------------------------------------------------------------------
# The offline guard: here, and (through a sitecustomize shim) in every spawned server process
# ---------------------------------------------------------------------------------------------

GUARD_CODE = r'''
import os, socket, ipaddress

def _loopback(host):
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    host = str(host).strip("[]").lower()
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False

def _violation(what):
    path = os.environ.get("A4SX_TEST_GUARD_LOG")
    if path:
        with open(path, "a") as f:
            f.write(what + "\n")
    raise OSError("offline guard: %s" % what)

_getaddrinfo = socket.getaddrinfo
def getaddrinfo(host, *args, **kwargs):
    if not _loopback(host):
        _violation("resolve %r" % (host,))
    return _getaddrinfo(host, *args, **kwargs)
socket.getaddrinfo = getaddrinfo

_connect = socket.socket.connect
def connect(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and not _loopback(address[0]):
        _violation("connect %r" % (address[0],))
    return _connect(self, address)
socket.socket.connect = connect

_connect_ex = socket.socket.connect_ex
def connect_ex(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and not _loopback(address[0]):
        _violation("connect %r" % (address[0],))
    return _connect_ex(self, address)
socket.socket.connect_ex = connect_ex
'''


@pytest.fixture(scope="session")
def guard_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("guard")
    (path / "sitecustomize.py").write_text(GUARD_CODE)
    return str(path)


_guard_namespace = {}
exec(compile(GUARD_CODE, "<offline guard>", "exec"), _guard_namespace)  # installs it in this process


@pytest.fixture(autouse=True)
def env(tmp_path, monkeypatch, guard_dir):
    """Every test: a throwaway HOME and config dir, no inherited A4SX_* variables, and a guard log
    that must stay empty."""
    for key in list(os.environ):
        if key.startswith("A4SX_"):
            monkeypatch.delenv(key)
    home = tmp_path / "home"
    cfg = tmp_path / "cfg"
    home.mkdir()
    cfg.mkdir()
    guard_log = tmp_path / "guard.log"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("A4SX_CONFIG_DIR", str(cfg))
    monkeypatch.setenv("A4SX_TEST_GUARD_LOG", str(guard_log))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([guard_dir, HERE]))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    yield {"home": home, "cfg": cfg}
    violations = guard_log.read_text() if guard_log.exists() else ""
    assert violations == "", "network access outside loopback: " + violations


def test_guard_blocks_non_loopback_here_and_in_children(tmp_path):
    with pytest.raises(OSError, match="offline guard"):
        socket.getaddrinfo("session-exchange.com", 443)
    child = subprocess.run([sys.executable, "-c", "import socket; socket.getaddrinfo('example.org', 80)"],
                           capture_output=True, text=True)
    assert child.returncode != 0 and "offline guard" in child.stderr
    log = tmp_path / "guard.log"
    assert "example.org" in log.read_text() and "session-exchange.com" in log.read_text()
    log.unlink()  # these two were on purpose


# ---------------------------------------------------------------------------------------------
# Helpers: secret-shaped strings built at run time, the stub, a spawned server over real pipes
# ---------------------------------------------------------------------------------------------


def make_token():
    return "ge" + "_sess_" + secrets.token_hex(20)


def sign_in(env, origin, token=None):
    token = token or make_token()
    path = env["cfg"] / "credentials.json"
    creds = json.loads(path.read_text()) if path.exists() else {}
    creds[origin] = token
    path.write_text(json.dumps(creds))
    os.chmod(path, 0o600)
    return token


@pytest.fixture
def stub():
    server = Stub()
    yield server
    server.stop()


@pytest.fixture
def token(env, stub):
    tok = sign_in(env, stub.base)
    stub.tokens.add(tok)
    return tok


class McpProcess:
    """A server process and a line-oriented JSON-RPC client over its pipes."""

    def __init__(self, args=(), base=None, extra_env=None):
        cmd = [sys.executable, SERVER] + (["--base", base] if base else []) + list(args)
        environ = dict(os.environ, **(extra_env or {}))
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=environ)
        self.lines = queue.Queue()
        self.raw_stdout = []
        self.stderr = []
        self.next_id = 1000
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._pump_err, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            self.raw_stdout.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def _pump_err(self):
        for line in self.proc.stderr:
            self.stderr.append(line.decode("utf-8", "replace"))

    def send_raw(self, data):
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, message):
        self.send_raw(json.dumps(message).encode() + b"\n")

    def recv(self, timeout=20):
        line = self.lines.get(timeout=timeout)
        assert line is not None, "server closed stdout; stderr: " + "".join(self.stderr)
        assert line.endswith(b"\n")
        return json.loads(line)

    def request(self, method, params=None, msg_id=None, timeout=20):
        """Send a request; return its response (notifications that arrive first are kept)."""
        msg_id = self._id() if msg_id is None else msg_id
        message = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)
        return self.wait_for(msg_id, timeout)

    def wait_for(self, msg_id, timeout=20):
        deadline = time.monotonic() + timeout
        self.notes = getattr(self, "notes", [])
        while True:
            message = self.recv(max(0.1, deadline - time.monotonic()))
            if isinstance(message, dict) and "id" in message and message["id"] == msg_id and "method" not in message:
                return message
            self.notes.append(message)

    def _id(self):
        self.next_id += 1
        return self.next_id

    def initialize(self, version="2025-11-25"):
        response = self.request("initialize", {"protocolVersion": version, "capabilities": {},
                                               "clientInfo": {"name": "tests", "version": "0"}})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return response

    def call(self, name, arguments=None, meta=None, timeout=30):
        params = {"name": name}
        if arguments is not None:
            params["arguments"] = arguments
        if meta:
            params["_meta"] = meta
        return self.request("tools/call", params, timeout=timeout)

    def tool(self, name, arguments=None, timeout=30):
        """A tool result (legacy 2025-11-25 session): ``(structured, text, is_error)``."""
        response = self.call(name, arguments, timeout=timeout)
        assert "result" in response, response
        result = response["result"]
        return result["structuredContent"], result["content"][0]["text"], result["isError"]

    def close(self, timeout=20):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        code = self.proc.wait(timeout)
        time.sleep(0.05)
        return code

    def all_output(self):
        return b"".join(self.raw_stdout).decode("utf-8", "replace") + "".join(self.stderr)


@pytest.fixture
def spawn(stub):
    started = []

    def start(args=(), base=None, initialize="2025-11-25", extra_env=None):
        proc = McpProcess(args, base or stub.base, extra_env)
        started.append(proc)
        if initialize:
            assert "result" in proc.initialize(initialize)
        return proc

    yield start
    for proc in started:
        if proc.proc.poll() is None:
            proc.proc.kill()
            proc.proc.wait()
        for line in proc.raw_stdout:  # stdout carries JSON-RPC messages only, one per line
            assert isinstance(json.loads(line), (dict, list))


@pytest.fixture
def mcp(spawn):
    return spawn()


def envelope_parts(text):
    """Split a framed text into (before BEGIN, inside, END line, after END); asserts the shape."""
    lines = text.split("\n")
    begins = [i for i, line in enumerate(lines) if re.fullmatch(r"<<<A4SX_UNTRUSTED_SESSION nonce=[0-9a-f]{16}>>>", line)]
    ends = [i for i, line in enumerate(lines) if re.fullmatch(r"<<<END_A4SX_UNTRUSTED_SESSION nonce=[0-9a-f]{16}>>>", line)]
    assert len(begins) == 1 and len(ends) == 1, text[:500]
    begin, end = begins[0], ends[0]
    nonce = lines[begin].split("nonce=")[1][:16]
    assert lines[end].split("nonce=")[1][:16] == nonce
    assert begin < end
    assert text.count("END_A4SX_UNTRUSTED_SESSION") == 1 + sum(line.count("END_A4SX_UNTRUSTED_SESSION")
                                                               for line in lines[:begin])
    notice = lines[:begin]
    assert notice and notice[0].startswith("> ")
    assert all(line.startswith("> ") or line == "" for line in notice)
    return notice, lines[begin + 1:end], lines[end], lines[end + 1:]


def assert_framed_json(text, structured):
    notice, inside, _, after = envelope_parts(text)
    assert len(inside) == 1
    body = json.loads(inside[0])
    assert "notice" not in body and "next" not in body and "next_offset" not in body
    assert structured["notice"] and "untrusted" in structured["notice"]
    assert len(after) <= 1
    if after:
        assert after[0].startswith("a4sx server hints (not author content): ")
        hints = json.loads(after[0].split(": ", 1)[1])
        assert set(hints) <= {"next", "next_offset"}
        assert isinstance(hints.get("next_offset", 0), int)
        assert hints.get("next", a4sx_mcp.ACQUIRED_NEXT) in (
            a4sx_mcp.ACQUIRED_NEXT, a4sx_mcp.NEVER_BUYS, "more results: call again with offset = next_offset")
    size = len(json.dumps(text, separators=(",", ":"))) + len(json.dumps(structured, separators=(",", ":")))
    assert size <= 64 * 1024
    return body


def write_transcript(records):
    return claude_jsonl(records).decode()


def cc_transcript(session_id="sess-1", turns=3):
    records = []
    for i in range(turns):
        records.append(claude_record("user", "question %d" % i, session_id=session_id))
        records.append(claude_record("assistant", "answer %d" % i, session_id=session_id))
    return write_transcript(records)


# ---------------------------------------------------------------------------------------------
# Starting: the three ways to run it, --base rules, exit status
# ---------------------------------------------------------------------------------------------


def _first_answer(cmd, cwd=None, env=None):
    msg = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
           "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    done = subprocess.run(cmd, input=json.dumps(msg).encode() + b"\n", capture_output=True, timeout=30, cwd=cwd,
                          env=env)
    return done


@pytest.mark.parametrize("how", ["script", "module", "copied-file"])
def test_every_way_of_starting_serves_mcp_and_exits_0_on_eof(how, stub, tmp_path):
    cmd = {"script": [sys.executable, SERVER],
           "module": [sys.executable, "-m", "a4sx_mcp"],
           "copied-file": [sys.executable, str(tmp_path / "a4sx_mcp.py")]}[how]
    if how == "copied-file":
        (tmp_path / "a4sx_mcp.py").write_bytes(open(SERVER, "rb").read())
    done = _first_answer(cmd + ["--base", stub.base], cwd=str(tmp_path) if how == "copied-file" else HERE)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.decode().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])["result"]
    assert result["serverInfo"]["name"] == "a4sx-mcp" and result["protocolVersion"] == "2025-11-25"


@pytest.mark.parametrize("base, fragment", [
    ("http://example.com", "refusing plain http"),
    ("ftp://127.0.0.1", "unsupported scheme"),
    ("http://", "no host"),
    ("https://host:99999", "bad port"),
])
def test_bad_base_exits_2_with_a_message(base, fragment):
    done = subprocess.run([sys.executable, SERVER, "--base", base], capture_output=True, text=True, timeout=20,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 2
    assert fragment in done.stderr and done.stdout == ""


def test_bad_base_from_env_exits_2(monkeypatch):
    monkeypatch.setenv("A4SX_BASE", "http://10.1.2.3")
    done = subprocess.run([sys.executable, SERVER], capture_output=True, text=True, timeout=20,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and "refusing plain http" in done.stderr


def test_version_and_help_and_unknown_flag():
    done = subprocess.run([sys.executable, SERVER, "--version"], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0 and done.stdout.strip() == "a4sx-mcp " + a4sx_mcp.__version__
    done = subprocess.run([sys.executable, SERVER, "--help"], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0 and "--base URL" in done.stdout and "--check" in done.stdout
    done = subprocess.run([sys.executable, SERVER, "--frobnicate"], capture_output=True, text=True, timeout=20)
    assert done.returncode == 2 and "--frobnicate" in done.stderr


@pytest.mark.parametrize("value, origin", [
    ("session-exchange.com", "https://session-exchange.com"),
    ("https://session-exchange.com:443/some/path?q=1", "https://session-exchange.com"),
    ("localhost:8080", "http://localhost:8080"),
    ("127.0.0.5:80/", "http://127.0.0.5"),
    ("[::1]:9000", "http://[::1]:9000"),
    ("HTTPS://Example.COM/", "https://example.com"),
    ("http://localhost/", "http://localhost"),
])
def test_base_normalisation(value, origin):
    assert a4sx_mcp.normalize_base(value) == origin


def test_base_resolution_order(env, monkeypatch):
    (env["cfg"] / "amdx.json").write_text(json.dumps({"base": "https://legacy.example"}))
    assert a4sx_mcp.resolve_base(None) == ("https://legacy.example", "config.json")
    (env["cfg"] / "config.json").write_text(json.dumps({"base": "https://stored.example"}))
    assert a4sx_mcp.resolve_base(None)[0] == "https://stored.example"
    monkeypatch.setenv("A4SX_BASE", "https://env.example/x")
    assert a4sx_mcp.resolve_base(None) == ("https://env.example", "A4SX_BASE")
    assert a4sx_mcp.resolve_base("flag.example") == ("https://flag.example", "--base")


# ---------------------------------------------------------------------------------------------
# Legacy handshake revisions
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("requested, answered", [(v, v) for v in LEGACY] + [
    ("2026-07-28", "2025-11-25"), ("1999-01-01", "2025-11-25"), (None, "2025-11-25")])
def test_initialize_echoes_known_versions_else_latest(spawn, requested, answered):
    proc = spawn(initialize=None)
    response = proc.initialize(requested)
    result = response["result"]
    assert result["protocolVersion"] == answered
    assert result["capabilities"] == {"tools": {}}
    assert result["serverInfo"]["name"] == "a4sx-mcp" and result["serverInfo"]["version"] == a4sx_mcp.__version__
    assert "never buys" in result["instructions"] and "privately" in result["instructions"]
    assert "resultType" not in result
    assert proc.request("ping")["result"] == {}
    assert proc.close() == 0


@pytest.mark.parametrize("version", LEGACY + [MODERN])
def test_tools_list_fixed_order_and_per_version_fields(spawn, version):
    if version == MODERN:
        proc = spawn(initialize=None)
        result = proc.request("tools/list", {"_meta": MODERN_META})["result"]
    else:
        proc = spawn(initialize=version)
        result = proc.request("tools/list")["result"]
    tools = result["tools"]
    assert [t["name"] for t in tools] == TOOL_NAMES
    for tool in tools:
        schema = tool["inputSchema"]
        assert schema["type"] == "object" and schema["additionalProperties"] is False
        assert ("annotations" in tool) == (version >= "2025-03-26")
        assert ("title" in tool) == (version >= "2025-06-18")
        if version >= "2025-06-18":
            assert tool["annotations"]["title"] == tool["title"]
    if version == MODERN:
        assert result["resultType"] == "complete" and result["ttlMs"] >= 0 and result["cacheScope"] == "public"
        assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "a4sx-mcp"
    else:
        assert "resultType" not in result and "ttlMs" not in result


def test_tool_schemas_match_the_spec_exactly():
    tools = {t["name"]: t for t in a4sx_mcp.TOOLS}
    ident = {"type": "string", "minLength": 1, "maxLength": 200, "pattern": "^[A-Za-z0-9][A-Za-z0-9._:@-]*$"}
    assert tools["get_session_summary"]["inputSchema"]["properties"]["id"] == ident
    assert tools["publish_session"]["inputSchema"]["properties"]["parent"] == ident
    search = tools["search_sessions"]["inputSchema"]["properties"]
    assert search["limit"] == {"type": "integer", "minimum": 1, "maximum": 50, "default": 10}
    assert search["offset"] == {"type": "integer", "minimum": 0, "maximum": 10000, "default": 0}
    assert search["harness"]["maxItems"] == 5 and search["tags"]["maxItems"] == 10
    assert search["harness"]["items"]["enum"] == ["claude-code", "codex-cli", "gemini-cli", "grok-build", "opencode",
                                                  "unknown"]
    fetch = tools["fetch_session_context"]["inputSchema"]
    assert fetch["required"] == ["id"]
    assert fetch["properties"]["max_tokens"] == {"type": "integer", "minimum": 500, "maximum": 100000, "default": 8000}
    publish = tools["publish_session"]["inputSchema"]
    assert publish["required"] == ["transcript"]
    assert publish["properties"]["visibility"] == {"type": "string", "enum": ["private"], "default": "private"}
    assert publish["properties"]["idempotency_key"]["pattern"] == "^[\\x21-\\x7e]+$"
    assert tools["acquire_session"]["inputSchema"]["properties"]["version"]["default"] == "latest"
    expected = {
        "search_sessions": (True, False, True, False), "get_session_summary": (True, False, True, False),
        "fetch_session_context": (True, False, True, False), "acquire_session": (False, False, True, False),
        "publish_session": (False, False, False, False)}
    for name, hints in expected.items():
        ann = tools[name]["annotations"]
        assert (ann["readOnlyHint"], ann["destructiveHint"], ann["idempotentHint"], ann["openWorldHint"]) == hints
    assert [tools[n]["title"] for n in TOOL_NAMES] == [
        "Search sessions", "Session summary", "Acquire session", "Load session as context", "Save session to library"]


def test_requests_before_initialize_without_modern_meta_are_refused(spawn):
    proc = spawn(initialize=None)
    response = proc.request("tools/list")
    assert response["error"]["code"] == -32602
    assert "io.modelcontextprotocol/protocolVersion" in response["error"]["message"]


@pytest.mark.parametrize("line, code", [
    (b"this is not json", -32700),
    (b"\xff\xfe{}", -32700),
    (b"DEEP", -32700),
    (b'"just a string"', -32600),
    (b"42", -32600),
    (b'{"jsonrpc":"2.0","id":true,"method":"ping"}', -32600),
    (b'{"jsonrpc":"2.0","id":1.5,"method":"ping"}', -32600),
    (b'{"jsonrpc":"2.0","id":null,"method":"ping"}', -32600),
    (b'{"id":7,"method":"ping"}', -32600),
    (b'{"jsonrpc":"2.0","id":8,"method":7}', -32600),
    (b'{"jsonrpc":"2.0","id":9,"method":"tools/list","params":[1]}', -32600),
    (b'{"jsonrpc":"2.0","id":10,"method":"no/such/method"}', -32601),
    (b'{"jsonrpc":"2.0","id":11,"method":"resources/list"}', -32601),
    (b'{"jsonrpc":"2.0","id":12,"method":"logging/setLevel","params":{"level":"debug"}}', -32601),
    (b'{"jsonrpc":"2.0","id":13,"method":"tools/call","params":{"name":"no_such_tool"}}', -32602),
    (b'{"jsonrpc":"2.0","id":14,"method":"tools/call","params":{"arguments":{}}}', -32602),
    (b'{"jsonrpc":"2.0","id":15,"method":"tools/list","params":{"cursor":"x"}}', -32602),
], ids=lambda value: value.decode("ascii", "replace")[:40] if isinstance(value, bytes) else str(value))
def test_bad_messages_get_json_rpc_errors_and_the_server_keeps_serving(mcp, line, code):
    if line == b"DEEP":
        line = b"[" * 100000 + b"]" * 100000
    mcp.send_raw(line + b"\n")
    response = mcp.recv()
    assert response["error"]["code"] == code
    readable = re.search(rb'"id":(\d+)[,}]', line)
    assert response["id"] == (int(readable.group(1)) if readable and code != -32700 else None)
    assert mcp.request("ping")["result"] == {}


def test_notifications_and_client_responses_are_never_answered(mcp):
    mcp.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    mcp.send({"jsonrpc": "2.0", "method": "notifications/whatever", "params": {"x": 1}})
    mcp.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 424242}})
    mcp.send({"jsonrpc": "2.0", "id": 77, "result": {}})
    mcp.send_raw(b"\n   \n")
    response = mcp.request("ping", msg_id="after")
    assert response == {"jsonrpc": "2.0", "id": "after", "result": {}}
    assert mcp.lines.empty()


def test_string_and_integer_ids_are_echoed_with_their_type(mcp):
    assert mcp.request("ping", msg_id="7")["id"] == "7"
    assert mcp.request("ping", msg_id=7)["id"] == 7
    assert mcp.request("ping", msg_id=-3)["id"] == -3


def test_batches_only_in_2025_03_26(spawn):
    proc = spawn(initialize="2025-03-26")
    batch = [{"jsonrpc": "2.0", "id": 1, "method": "ping"},
             {"jsonrpc": "2.0", "method": "notifications/initialized"},
             {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
             {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "search_sessions",
                                                                         "arguments": {"limit": 0}}},
             {"jsonrpc": "2.0", "id": 4, "method": "initialize", "params": {}},
             5]
    proc.send(batch)
    answer = proc.recv()
    assert isinstance(answer, list)
    by_id = {item["id"]: item for item in answer}
    assert set(by_id) == {1, 2, 3, 4, None}
    assert by_id[1]["result"] == {} and len(by_id[2]["result"]["tools"]) == 5
    assert by_id[3]["result"]["isError"] is True and by_id[4]["error"]["code"] == -32600
    proc.send([{"jsonrpc": "2.0", "method": "notifications/initialized"}])
    proc.send([])
    assert proc.recv()["error"]["code"] == -32600  # only the empty batch is answered
    for version in ("2024-11-05", "2025-06-18", "2025-11-25"):
        other = spawn(initialize=version)
        other.send([{"jsonrpc": "2.0", "id": 1, "method": "ping"}])
        response = other.recv()
        assert response["id"] is None and response["error"]["code"] == -32600


def test_oversized_line_is_answered_and_skipped(spawn):
    proc = spawn()
    big = b'{"jsonrpc":"2.0","id":99,"method":"tools/call","params":{"name":"publish_session","arguments":' \
          b'{"transcript":"' + b"x" * (a4sx_mcp.MAX_LINE_BYTES + 10) + b'"}}}\n'
    proc.send_raw(big)
    response = proc.recv(timeout=60)
    assert response["id"] == 99 and response["error"]["code"] == -32600
    assert "larger than" in response["error"]["message"]
    assert proc.request("ping")["result"] == {}


def test_stdout_stays_pure_even_if_code_prints(spawn, tmp_path):
    shim = tmp_path / "noisy"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(open(os.path.join(os.environ["PYTHONPATH"].split(os.pathsep)[0],
                                                             "sitecustomize.py")).read()
                                           + "\nimport builtins\nprint('noise from a library')\n")
    proc = spawn(initialize=None, extra_env={"PYTHONPATH": str(shim)})
    # the shim printed before the server took over stdout: that line is the only impurity we allow
    # ourselves to create here, so read past it and check the server's own output
    first = proc.lines.get(timeout=10)
    assert first == b"noise from a library\n"
    proc.raw_stdout.remove(first)
    assert proc.initialize()["result"]["protocolVersion"] == "2025-11-25"


# ---------------------------------------------------------------------------------------------
# Modern era (2026-07-28), per request, beside the legacy era in one process
# ---------------------------------------------------------------------------------------------


def test_server_discover(spawn):
    proc = spawn(initialize=None)
    result = proc.request("server/discover", {"_meta": MODERN_META})["result"]
    assert result["supportedVersions"] == [MODERN]
    assert result["capabilities"] == {"tools": {}}
    assert result["resultType"] == "complete" and result["cacheScope"] in ("public", "private")
    assert isinstance(result["ttlMs"], int) and result["ttlMs"] >= 0
    assert "never buys" in result["instructions"]
    info = result["_meta"]["io.modelcontextprotocol/serverInfo"]
    assert info["name"] == "a4sx-mcp" and info["version"] == a4sx_mcp.__version__


@pytest.mark.parametrize("meta, code", [
    ({"io.modelcontextprotocol/protocolVersion": "1900-01-01", "io.modelcontextprotocol/clientCapabilities": {}}, -32022),
    ({"io.modelcontextprotocol/protocolVersion": "2025-11-25", "io.modelcontextprotocol/clientCapabilities": {}}, -32022),
    ({"io.modelcontextprotocol/protocolVersion": 20260728, "io.modelcontextprotocol/clientCapabilities": {}}, -32602),
    ({"io.modelcontextprotocol/protocolVersion": MODERN}, -32602),
    ({"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": []}, -32602),
])
def test_modern_meta_is_validated_on_every_request(spawn, meta, code):
    proc = spawn(initialize=None)
    for method in ("server/discover", "tools/list", "tools/call"):
        params = {"_meta": meta}
        if method == "tools/call":
            params.update(name="search_sessions", arguments={})
        error = proc.request(method, params)["error"]
        assert error["code"] == code
        if code == -32022:
            assert error["data"] == {"supported": [MODERN], "requested": meta["io.modelcontextprotocol/protocolVersion"]}


def test_server_discover_without_meta_is_invalid_params(spawn):
    proc = spawn(initialize=None)
    assert proc.request("server/discover", {})["error"]["code"] == -32602
    assert proc.request("server/discover")["error"]["code"] == -32602


@pytest.mark.parametrize("method", ["ping", "logging/setLevel", "resources/subscribe", "prompts/list"])
def test_methods_removed_in_the_modern_revision(spawn, method):
    proc = spawn(initialize=None)
    assert proc.request(method, {"_meta": MODERN_META, "level": "info"})["error"]["code"] == -32601


def test_modern_tool_call_result_shape(spawn, stub):
    stub.listings["l-1"] = listing("l-1", title="flaky pytest fixtures")
    proc = spawn(initialize=None)
    result = proc.request("tools/call", {"name": "search_sessions", "arguments": {"query": "pytest"},
                                         "_meta": MODERN_META})["result"]
    assert result["resultType"] == "complete" and result["isError"] is False
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "a4sx-mcp"
    assert result["structuredContent"]["items"][0]["id"] == "l-1"
    assert "ttlMs" not in result


def test_both_eras_share_one_process(spawn, stub):
    proc = spawn(initialize="2024-11-05")
    modern = proc.request("tools/list", {"_meta": MODERN_META})["result"]
    legacy = proc.request("tools/list")["result"]
    assert "title" in modern["tools"][0] and modern["resultType"] == "complete"
    assert "title" not in legacy["tools"][0] and "annotations" not in legacy["tools"][0]
    call = proc.call("search_sessions", {"limit": 0})["result"]
    assert "structuredContent" not in call and call["isError"] is True  # 2024-11-05: text only
    assert call["content"][0]["text"].startswith("limit:")


def test_structured_content_only_from_2025_06_18(spawn):
    for version, has in (("2024-11-05", False), ("2025-03-26", False), ("2025-06-18", True), ("2025-11-25", True)):
        proc = spawn(initialize=version)
        result = proc.call("search_sessions", {"limit": 0})["result"]
        assert ("structuredContent" in result) == has
