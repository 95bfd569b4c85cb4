"""The load generator (build/verify_load) against a scripted HTTP server.

The server stands in for two proxies (two ports, one state): it keeps one
record per (tenant, key), replays it with `Idempotent-Replayed: true`,
answers a reused key with another body by a problem+json 422, forgets
refund records after the short ttl, and answers each key's first attempt by
the key's script (a hash of the key picks it): 409 with Retry-After: 1 then
201, 409 with Retry-After: 30 (beyond the cap) then 201, 503 then 201, a
stall past --timeout-ms then 201, 402, or 201 at once. It logs every request
it received and the answer it sent, so the generator's log is checked
against what really crossed the wire.

Build first: make build/verify_load
"""
import http.server
import json
import os
import socket
import subprocess
import threading
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOAD = os.environ.get("VERIFY_LOAD_BIN", os.path.join(ROOT, "build", "verify_load"))

A_COLS = ("A flow seq akind proxy t0 t1 tenant route key body_sha attempt_id "
          "status code replayed exec resp_hash retry_after_ms error").split()
F_COLS = ("F flow fkind tenant route key body_sha t_first t_final final cause "
          "attempts").split()
ROUTES = {"/v1/payments": "pay", "/v1/refunds": "refund", "/v1/transfers": "transfer"}
SCRIPTS = ("conflict", "capped", "unavail", "stall", "declined", "ok")
TIMEOUT_MS = 500
STALL_S = 0.9
SHORT_TTL_S = 1
RETRY_CAP_MS = 1500


def fnv(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def script_of(key):
    return SCRIPTS[int(fnv(key.encode()), 16) % len(SCRIPTS)]


def resp_hash(status, ctype, exec_, body):
    return fnv(b"%d\n%s\n%s\n" % (status, ctype.encode(), exec_.encode()) + body)


class Ledger:
    """The state both ports share, and the log of what was received and sent."""

    def __init__(self, mode):
        self.mode = mode  # "script", "stall_all" or "fail_all"
        self.lock = threading.Lock()
        self.records = {}
        self.early = {}
        self.log = []
        self.seq = 0

    def problem(self, status, code, retry_after=None):
        body = json.dumps({"type": "about:blank", "status": status,
                           "code": code}).encode()
        return {"status": status, "ctype": "application/problem+json",
                "exec": "", "body": body, "replayed": False,
                "retry_after": retry_after}

    def execute(self, port, tenant, key, path, body, status):
        self.seq += 1
        exec_ = "py-%d-%d" % (port, self.seq)
        out = json.dumps({"exec": exec_, "tenant": tenant, "key": key,
                          "body_sha": fnv(body)}).encode()
        ans = {"status": status, "ctype": "application/json", "exec": exec_,
               "body": out, "replayed": False, "retry_after": None}
        self.records[(tenant, key)] = dict(ans, req_body=body, t=time.time(), path=path)
        return ans

    def scripted(self, port, tenant, key, path, body):
        n = self.early[(tenant, key)] = self.early.get((tenant, key), 0) + 1
        script = script_of(key) if n == 1 else "ok"
        if script == "conflict":
            return self.problem(409, "in_flight", "1"), 0
        if script == "capped":
            return self.problem(409, "in_flight", "30"), 0
        if script == "unavail":
            return self.problem(503, "store_unavailable"), 0
        if script == "stall":
            return {"status": 201, "ctype": "application/json", "exec": "",
                    "body": b"{}", "replayed": False, "retry_after": None}, STALL_S
        return self.execute(port, tenant, key, path, body,
                            402 if script == "declined" else 201), 0

    def answer(self, port, tenant, key, path, body):
        if self.mode == "stall_all":
            return self.problem(503, "late"), 5.0
        if self.mode == "fail_all":
            return self.problem(503, "store_unavailable"), 0
        rec = self.records.get((tenant, key))
        if rec and path == "/v1/refunds" and time.time() - rec["t"] > SHORT_TTL_S:
            del self.records[(tenant, key)]
            self.early.pop((tenant, key), None)
            rec = None
        if rec and rec["req_body"] != body:
            return self.problem(409, "idempotency_key_mismatch"), 0
        if rec:
            return dict(rec, replayed=True), 0
        return self.scripted(port, tenant, key, path, body)


def make_handler(ledger, port):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            h = self.headers
            tenant, key = h.get("X-Tenant-Id", ""), h.get("Idempotency-Key", "")
            with ledger.lock:
                ans, stall = ledger.answer(port, tenant, key, self.path, body)
                ledger.log.append({
                    "port": port, "path": self.path, "tenant": tenant, "key": key,
                    "attempt_id": h.get("X-Attempt-Id", ""), "body": body,
                    "prefer": h.get("Prefer"), "ctype_in": h.get("Content-Type"),
                    "accept_encoding": h.get("Accept-Encoding"),
                    "stall": stall, "t": time.time(), "ans": ans})
            if stall:
                time.sleep(stall)
            try:
                self.send_response(ans["status"])
                self.send_header("Content-Type", ans["ctype"])
                self.send_header("Content-Length", str(len(ans["body"])))
                if ans["exec"]:
                    self.send_header("X-Ledger-Exec", ans["exec"])
                if ans["replayed"]:
                    self.send_header("Idempotent-Replayed", "true")
                if ans["retry_after"]:
                    self.send_header("Retry-After", ans["retry_after"])
                self.end_headers()
                self.wfile.write(ans["body"])
            except OSError:
                self.close_connection = True  # the client gave up (timeout)

    return Handler


@pytest.fixture
def servers():
    started = []

    def start(mode="script", n=2):
        ledger = Ledger(mode)
        urls = []
        for _ in range(n):
            srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), None)
            srv.RequestHandlerClass = make_handler(ledger, srv.server_address[1])
            srv.daemon_threads = True
            threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True).start()
            started.append(srv)
            urls.append("http://127.0.0.1:%d" % srv.server_address[1])
        return ledger, urls

    yield start
    for srv in started:
        srv.shutdown()
        srv.server_close()


def run_load(tmp_path, urls, *args, name="load.tsv"):
    assert os.access(LOAD, os.X_OK), "%s is missing: run `make build/verify_load`" % LOAD
    log = tmp_path / name
    cmd = [LOAD, "--log", str(log), "--timeout-ms", str(TIMEOUT_MS),
           "--retry-cap-ms", str(RETRY_CAP_MS), "--short-ttl-s", str(SHORT_TTL_S),
           "--tenants", "3"]
    for u in urls:
        cmd += ["--target", u]
    p = subprocess.run(cmd + [str(a) for a in args], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert len(lines) == 1, p.stdout
    summary = json.loads(lines[0])
    rows = log.read_text().splitlines()
    assert rows[0].split("\t") == A_COLS
    assert rows[1].split("\t") == F_COLS
    a_lines, f_lines = [], []
    for row in rows[2:]:
        cols = row.split("\t")
        if cols[0] == "A":
            assert len(cols) == len(A_COLS), row
            a_lines.append(dict(zip(A_COLS, cols)))
        else:
            assert cols[0] == "F" and len(cols) == len(F_COLS), row
            f_lines.append(dict(zip(F_COLS, cols)))
    assert summary["requests"] == len(a_lines)
    assert summary["flows"] == len(f_lines)
    return summary, a_lines, f_lines


def by_flow(a_lines):
    flows = {}
    for a in a_lines:
        flows.setdefault(int(a["flow"]), []).append(a)
    for v in flows.values():
        v.sort(key=lambda a: int(a["seq"]))
    return flows


def check_against_server(ledger, urls, a_lines):
    """Every A line is a request the server received, with what it answered."""
    got = {r["attempt_id"]: r for r in ledger.log}
    assert len(got) == len(ledger.log), "an X-Attempt-Id was sent twice"
    assert len({a["attempt_id"] for a in a_lines}) == len(a_lines)
    ports = [int(u.rsplit(":", 1)[1]) for u in urls]
    for a in a_lines:
        r = got[a["attempt_id"]]
        assert (r["key"], r["tenant"], ROUTES[r["path"]]) == (a["key"], a["tenant"], a["route"])
        assert fnv(r["body"]) == a["body_sha"]
        assert r["port"] == ports[int(a["proxy"])]
        assert r["ctype_in"] == "application/json" and r["accept_encoding"] is None
        assert r["prefer"] == ("wait=2" if a["akind"] == "wait" else None)
        ans = r["ans"]
        if r["stall"]:
            assert (a["status"], a["error"], a["resp_hash"]) == ("0", "timeout", "")
            continue
        assert a["error"] == ""
        code = json.loads(ans["body"]).get("code", "") if ans["status"] >= 400 else ""
        assert a["status"] == str(ans["status"]) and a["code"] == code
        assert a["replayed"] == ("1" if ans["replayed"] else "0")
        assert a["exec"] == ans["exec"]
        assert a["resp_hash"] == resp_hash(ans["status"], ans["ctype"], ans["exec"], ans["body"])
        ra = ans["retry_after"]
        assert a["retry_after_ms"] == (str(int(ra) * 1000) if ra else "")


def check_retries(flows, f_by_id):
    """Retries keep key and body; Retry-After is waited (capped), a timeout
    moves to the other target; a plain flow ends at its last answer."""
    seen = set()
    for fid, atts in flows.items():
        f = f_by_id[fid]
        if f["fkind"] != "plain":
            continue
        assert {(a["key"], a["body_sha"], a["tenant"]) for a in atts} == \
            {(f["key"], f["body_sha"], f["tenant"])}
        assert [int(a["seq"]) for a in atts] == list(range(len(atts)))
        assert int(f["attempts"]) == len(atts) and int(f["t_first"]) == int(atts[0]["t0"])
        assert (f["final"], f["cause"]) == ("1", atts[-1]["status"])
        assert f["cause"] in ("201", "402")
        for prev, nxt in zip(atts, atts[1:]):
            gap_ms = (int(nxt["t0"]) - int(prev["t1"])) / 1000
            if prev["retry_after_ms"] == "1000":
                seen.add("ra")
                assert 950 <= gap_ms < 1000 + 3000, gap_ms
            elif prev["retry_after_ms"] == "30000":
                seen.add("capped")
                assert RETRY_CAP_MS - 50 <= gap_ms < RETRY_CAP_MS + 3000, gap_ms
            elif prev["status"] == "503":
                seen.add("503")
                assert gap_ms < RETRY_CAP_MS + 3000
            elif prev["error"] == "timeout":
                seen.add("timeout")
                assert nxt["proxy"] != prev["proxy"]
            else:
                pytest.fail("a retry after %s" % prev)
    assert seen == {"ra", "capped", "503", "timeout"}, seen


def check_kinds(flows, f_by_id):
    """Each kind's follow-up, copies and headers."""
    kinds = {f["fkind"] for f in f_by_id.values()}
    assert kinds == {"plain", "dup", "mismatch", "tenant", "late", "recheck", "wait"}
    dup_proxies, replays = set(), 0
    for fid, atts in flows.items():
        f, main = f_by_id[fid], [a for a in atts if a["akind"] in ("req", "dup", "wait", "recheck")]
        assert {(a["key"], a["body_sha"], a["tenant"]) for a in main} == \
            {(f["key"], f["body_sha"], f["tenant"])}
        follow = [a for a in atts if a["akind"] in ("mismatch", "tenant", "late")]
        last = follow[-1] if follow else None
        replays += sum(a["replayed"] == "1" for a in atts)
        first_exec = next((a["exec"] for a in main if a["exec"]), "")
        if f["fkind"] == "dup":
            copies = [a for a in atts if a["akind"] == "dup"]
            assert 2 <= len(copies) <= 3 and int(f["attempts"]) == len(atts)
            dup_proxies |= {a["proxy"] for a in copies}
        elif f["fkind"] == "wait":
            assert all(a["akind"] == "wait" for a in atts) and len(atts) >= 2
        elif f["fkind"] == "mismatch" and f["final"] == "1":
            assert last["body_sha"] != f["body_sha"] and last["key"] == f["key"]
            assert (last["status"], last["code"]) == ("409", "idempotency_key_mismatch")
            # The proxy's mismatch answer is final: never retried.
            assert sum(a["akind"] == "mismatch" for a in atts) == 1
        elif f["fkind"] == "tenant" and f["final"] == "1":
            assert last["tenant"] != f["tenant"] and last["body_sha"] == f["body_sha"]
            assert last["replayed"] == "0" and last["exec"] not in ("", first_exec)
        elif f["fkind"] == "late" and f["final"] == "1":
            assert f["route"] == "refund"
            assert int(follow[0]["t0"]) - int(f["t_final"]) >= (SHORT_TTL_S + 2) * 1e6 - 50000
            assert last["replayed"] == "0" and last["exec"] not in ("", first_exec)
        elif f["fkind"] == "recheck":
            assert all(a["akind"] == "recheck" for a in atts) and f["route"] != "refund"
            assert int(f["key"].split("-")[1]) < fid
            assert atts[-1]["replayed"] == "1" and atts[-1]["exec"]
    assert dup_proxies == {"0", "1"} and replays > 0


def test_flows_retries_and_log_columns(servers, tmp_path):
    ledger, urls = servers()
    summary, a_lines, f_lines = run_load(
        tmp_path, urls, "--seed", 11, "--rate", 30, "--seconds", 3,
        "--flow-ms", 10000, "--drain-ms", 8000, "--concurrency", 16)
    f_by_id = {int(f["flow"]): f for f in f_lines}
    assert len(f_by_id) == len(f_lines) >= 60
    flows = by_flow(a_lines)
    assert set(flows) == set(f_by_id)
    check_against_server(ledger, urls, a_lines)
    check_retries(flows, f_by_id)
    check_kinds(flows, f_by_id)
    assert {f["final"] for f in f_lines} == {"1"}
    assert set(summary["by_kind"]) == {"plain", "dup", "mismatch", "tenant", "late",
                                       "recheck", "wait"}


def draws(f_lines):
    return {int(f["flow"]): (f["fkind"], f["tenant"], f["route"], f["key"], f["body_sha"])
            for f in f_lines if f["fkind"] != "recheck"}


def test_same_seed_draws_same_flows(servers, tmp_path):
    runs = []
    for i, seed in enumerate((5, 5, 6)):
        _, urls = servers()
        _, _, f_lines = run_load(tmp_path, urls, "--seed", seed, "--rate", 100,
                                 "--requests", 100, "--drain-ms", 300,
                                 name="load%d.tsv" % i)
        runs.append(draws(f_lines))
    common = set(runs[0]) & set(runs[1])
    assert len(common) >= 30
    assert all(runs[0][i] == runs[1][i] for i in common)
    other = set(runs[0]) & set(runs[2])
    assert sum(runs[0][i][4] != runs[2][i][4] for i in other) == len(other)
    assert any(runs[0][i][0] != runs[2][i][0] for i in other)


def test_stop_cuts_what_is_in_flight(servers, tmp_path):
    """A request still waiting at the end of the drain is cut: stopped."""
    _, urls = servers("stall_all", 1)
    summary, a_lines, f_lines = run_load(
        tmp_path, urls, "--seed", 1, "--rate", 5, "--requests", 1,
        "--timeout-ms", 4000, "--drain-ms", 300)
    assert [(a["status"], a["error"]) for a in a_lines] == [("0", "stopped")]
    assert [(f["final"], f["cause"]) for f in f_lines] == [("0", "stopped")]
    assert summary["stopped"] == 1


def test_deadline_and_connect_errors(servers, tmp_path):
    """An upstream that only fails ends each flow at --flow-ms (deadline);
    a target that refuses connections is left for the next one."""
    _, urls = servers("fail_all", 1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = "http://127.0.0.1:%d" % s.getsockname()[1]
        _, a_lines, f_lines = run_load(
            tmp_path, [dead] + urls, "--seed", 3, "--rate", 20, "--requests", 6,
            "--flow-ms", 700, "--drain-ms", 3000, "--mix", "plain=1")
    assert f_lines and all((f["final"], f["cause"]) == ("0", "deadline") for f in f_lines)
    flows = by_flow(a_lines)
    for atts in flows.values():
        for prev, nxt in zip(atts, atts[1:]):
            if prev["error"] == "connect":
                assert (prev["proxy"], nxt["proxy"]) == ("0", "1")
            else:
                assert (prev["status"], prev["code"]) == ("503", "store_unavailable")
    assert any(a["error"] == "connect" for a in a_lines)
    assert all(len(atts) >= 2 for atts in flows.values())
