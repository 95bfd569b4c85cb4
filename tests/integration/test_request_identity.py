"""The request the proxy decides on is the request it executes, and whose it
is cannot be faked: every spelling of a protected path is protected (15),
the upstream sees one spelling of the key and always gets it (16), one
credential is one tenant (17), tenants from different sources never meet
(18), and a value cannot forge a field or a line in the log (20)."""
import hashlib
import json
import re
import socket

import pytest

from conftest import ADMIN_TOKEN, run_binary
from helpers import TIMEOUT, assert_problem, is_replay, new_key, raw_request

PAY = "/v1/payments"


def routes_with_catch_all():
    """A protected route, one with a parameter, and the catch-all that an
    unrecognised spelling would fall into."""
    return [
        {"name": "create_payment", "path": "/v1/payments", "upstream": "{stub}"},
        {"name": "capture", "path": "/v1/payments/{id}/capture", "upstream": "{stub}"},
        {"name": "hooks", "path": "/hooks/*", "upstream": "{stub}",
         "tenant": "header:X-Tenant-Id"},
        {"name": "auth", "path": "/v1/auth/*", "upstream": "{stub}",
         "tenant": "authorization"},
        {"name": "anything", "path": "/*", "upstream": "{stub}", "key": "optional"},
    ]


# --- 15: every spelling of a protected path ---------------------------------

# Spellings the upstream may read as a protected path: each must either be
# matched as that path (and then need its key) or be refused.
SPELLINGS = [
    "/v1/pay%6dents", "/v1/pay%6Dents", "/v1/%70ayments", "/%76%31/payments",
    "/v1/payments/", "/v1/payments//", "/v1//payments", "//v1/payments",
    "/v1/./payments", "/v1/x/../payments", "/v1/%2e/payments", "/v1/%2E%2e/v1/payments",
    "/x/..%2Fv1/payments", "/v1%2Fpayments", "/v1%2fpayments", "/v1/payments%2F",
    "/v1/payments/.", "/v1/payments/x/%63apture", "/v1/payments/x/capture/",
    "/v1/payments/x%2F/capture", "/v1/payments/%", "/v1/pay%zzments",
]


@pytest.mark.parametrize("target", SPELLINGS)
def test_no_spelling_of_a_protected_path_passes_unprotected(make_proxy, stub, pg, target):
    proxy = make_proxy(routes=routes_with_catch_all())
    r = raw_request(proxy.port, "POST", target,
                    [("Content-Type", "application/json")], b'{"amount": 1}')
    assert r.status_code == 400, (r.status_code, r.content)
    assert r.json()["code"] in ("idempotency_key_missing", "bad_request"), r.content
    assert stub.requests() == []
    assert pg.records() == []
    # The catch-all is there and does take an unprotected POST.
    ok = raw_request(proxy.port, "POST", "/other/thing",
                     [("Content-Type", "application/json")], b'{"amount": 1}')
    assert ok.status_code == 201
    assert [s.target for s in stub.requests()] == ["/other/thing"]


@pytest.mark.parametrize("target,operation", [
    ("/v1/pay%6dents", "create_payment"),
    ("/v1/payments/", "create_payment"),
    ("/v1/payments/p%5F1/%63apture?x=%6d", "capture"),
])
def test_an_equivalent_spelling_is_claimed_under_its_route_and_forwarded_as_sent(
        make_proxy, stub, pg, target, operation):
    proxy = make_proxy(routes=routes_with_catch_all())
    key = new_key()
    r = raw_request(proxy.port, "POST", target,
                    [("Content-Type", "application/json"), ("Idempotency-Key", key)],
                    b'{"amount": 1}')
    assert r.status_code == 201, r.content
    assert [s.target for s in stub.requests()] == [target]
    assert [(x["operation"], x["state"]) for x in pg.records(key)] == \
        [(operation, "completed")]
    again = raw_request(proxy.port, "POST", target,
                        [("Content-Type", "application/json"), ("Idempotency-Key", key)],
                        b'{"amount": 1}')
    assert is_replay(again) and again.content == r.content
    assert stub.count() == 1


def test_a_refused_spelling_says_why(make_proxy, stub, pg):
    proxy = make_proxy(routes=routes_with_catch_all())
    key = new_key()
    for target, words in [("/v1/x/../payments", "'.'"), ("/v1//payments", "empty"),
                          ("/v1%2Fpayments", "%2F"), ("/v1/pay%zzments", "hex")]:
        r = raw_request(proxy.port, "POST", target, [("Idempotency-Key", key)], b"{}")
        doc = assert_problem(r, 400, "bad_request")
        assert words in doc["detail"], doc
    assert stub.requests() == [] and pg.records() == []


# --- 16: the key and identity headers the upstream sees ---------------------

def test_the_upstream_sees_one_spelling_of_the_key_on_every_attempt(proxy, stub, pg):
    key = new_key()
    stub.configure({"prefix": PAY, "status": 503, "times": 2})
    spellings = [key, '"%s";retry=1' % key, '  "%s"  ' % key]
    for i, spelled in enumerate(spellings):
        r = raw_request(proxy.port, "POST", PAY,
                        [("Content-Type", "application/json"),
                         ("Idempotency-Key", spelled)], b'{"amount": 1}')
        assert r.status_code == (503 if i < 2 else 201), r.content
    seen = stub.requests()
    assert len(seen) == 3
    assert [s.headers("Idempotency-Key") for s in seen] == [[key]] * 3
    assert pg.record(key)["attempt"] == 3


@pytest.mark.parametrize("sent,forwarded", [
    ('"abc"', "abc"),
    ('"a b"', '"a b"'),
    (r'"a\"b\\c"', r'"a\"b\\c"'),
    ("a:b/c=d", "a:b/c=d"),
])
def test_the_forwarded_key_is_canonical(proxy, stub, pg, sent, forwarded):
    r = raw_request(proxy.port, "POST", PAY, [("Idempotency-Key", sent)], b"{}")
    assert r.status_code == 201, r.content
    assert stub.requests()[0].headers("Idempotency-Key") == [forwarded]


def test_connection_cannot_strip_the_key_tenant_or_credentials(proxy, stub, pg):
    key = new_key()
    r = raw_request(proxy.port, "POST", "/hooks/x",
                    [("Connection", "keep-alive, Idempotency-Key, X-Tenant-Id, X-Drop"),
                     ("Idempotency-Key", key), ("X-Tenant-Id", "acme"),
                     ("X-Drop", "gone")], b"{}")
    assert r.status_code == 201, r.content
    got = stub.requests()[0]
    assert got.headers("Idempotency-Key") == [key]
    assert got.headers("X-Tenant-Id") == ["acme"]
    assert got.headers("X-Drop") == []          # an ordinary hop-by-hop header goes
    cred = "Bearer c-" + key
    r = raw_request(proxy.port, "POST", "/v1/auth/x",
                    [("Connection", "Authorization, Idempotency-Key"),
                     ("Idempotency-Key", key), ("Authorization", cred)], b"{}")
    assert r.status_code == 201, r.content
    got = stub.requests()[1]
    assert got.headers("Authorization") == [cred]
    assert got.headers("Idempotency-Key") == [key]


# --- 17: one credential, one tenant -----------------------------------------

def test_two_authorization_headers_are_refused(proxy, stub, pg):
    r = raw_request(proxy.port, "POST", "/v1/auth/x",
                    [("Idempotency-Key", new_key()), ("Authorization", "Bearer a"),
                     ("Authorization", "Bearer b")], b"{}")
    assert_problem(r, 400, "bad_request")
    assert stub.requests() == [] and pg.records() == []


@pytest.mark.parametrize("variant", ["bearer {s}", "BEARER {s}", "Bearer {s}  ",
                                     "Bearer {s}\t", "bEaReR   {s}"])
def test_an_authorization_spelling_is_the_same_tenant(proxy, stub, pg, variant):
    key = new_key()
    secret = "sk_" + key
    first = raw_request(proxy.port, "POST", "/v1/auth/x",
                        [("Idempotency-Key", key), ("Authorization", "Bearer " + secret)],
                        b"{}")
    assert first.status_code == 201
    again = raw_request(proxy.port, "POST", "/v1/auth/x",
                        [("Idempotency-Key", key),
                         ("Authorization", variant.format(s=secret))], b"{}")
    assert again.status_code == 201 and is_replay(again), again.content
    assert stub.count() == 1
    assert len(pg.records(key)) == 1
    # the credential itself is case-sensitive: another tenant
    other = raw_request(proxy.port, "POST", "/v1/auth/x",
                        [("Idempotency-Key", key),
                         ("Authorization", "Bearer " + secret.upper())], b"{}")
    assert other.status_code == 201 and not is_replay(other)
    assert stub.count() == 2


# --- 18: tenants name their source ------------------------------------------

def sha(s):
    return hashlib.sha256(s.encode()).hexdigest()


def test_header_tenant_never_meets_a_static_tenant(make_proxy, stub, pg):
    key = new_key()
    first = make_proxy(route_overrides={"hooks": {"tenant": "static:default"}})
    r1 = first.post("/hooks/x", key=key, json={"amount": 1})
    assert r1.status_code == 201
    first.stop()
    second = make_proxy(route_overrides={"hooks": {"tenant": "header:X-Tenant-Id"}})
    r2 = second.post("/hooks/x", key=key, json={"amount": 1},
                     headers={"X-Tenant-Id": "default"})
    assert r2.status_code == 201 and not is_replay(r2)
    assert stub.count() == 2
    assert sorted(x["tenant"] for x in pg.records(key)) == ["default", "header:default"]


def test_stored_tenants_name_their_source(proxy, stub, pg):
    key = new_key()
    cred = "Bearer c-" + key
    assert proxy.post(PAY, key=key, json={}).status_code == 201
    assert proxy.post("/hooks/x", key=key, json={},
                      headers={"X-Tenant-Id": "acme"}).status_code == 201
    assert proxy.post("/v1/auth/x", key=key, json={},
                      headers={"Authorization": cred}).status_code == 201
    assert sorted((x["operation"], x["tenant"]) for x in pg.records(key)) == [
        ("auth", "authorization:" + sha(cred)), ("create_payment", "default"),
        ("hooks", "header:acme")]


def test_a_static_tenant_may_not_contain_a_colon(make_proxy, tmp_path):
    p = make_proxy(route_overrides={"hooks": {"tenant": "static:header:acme"}},
                   migrate=False, start=False)
    r = run_binary(["-c", p.conf_path, "--check"])
    assert r.returncode == 1
    assert "':'" in r.stderr, r.stderr


def test_migrate_names_the_source_of_existing_tenants_once(make_proxy, stub, pg):
    """Records written before tenants named their source are converted by
    --migrate for the routes whose source the conf says, so a retry of a
    pre-upgrade key is still a replay, not a second charge."""
    proxy = make_proxy()
    key = new_key()
    cred = "Bearer c-" + key
    sent = [(PAY, {}), ("/hooks/x", {"X-Tenant-Id": "acme"}),
            ("/v1/auth/x", {"Authorization": cred})]
    firsts = [proxy.post(p, key=key, json={"n": 1}, headers=h) for p, h in sent]
    assert [r.status_code for r in firsts] == [201] * 3
    proxy.stop()
    # Make the database look as it did before: unprefixed tenants, no 003.
    pg.execute("UPDATE idempotency_records SET tenant = split_part(tenant, ':', 2) "
               "WHERE tenant LIKE '%:%'")
    pg.execute("DELETE FROM schema_migrations WHERE version = 3")
    assert sorted(x["tenant"] for x in pg.records(key)) == sorted(
        ["default", "acme", sha(cred)])
    r = run_binary(["-c", proxy.conf_path, "--migrate"], env=proxy.env)
    assert r.returncode == 0, r.stderr
    want = [("auth", "authorization:" + sha(cred)), ("create_payment", "default"),
            ("hooks", "header:acme")]
    assert sorted((x["operation"], x["tenant"]) for x in pg.records(key)) == want
    assert pg.query("SELECT count(*) AS n FROM schema_migrations WHERE version = 3")[0]["n"] == 1
    # A second run changes nothing.
    r = run_binary(["-c", proxy.conf_path, "--migrate"], env=proxy.env)
    assert r.returncode == 0, r.stderr
    assert sorted((x["operation"], x["tenant"]) for x in pg.records(key)) == want
    again = make_proxy(migrate=False)
    for (p, h), first in zip(sent, firsts):
        rr = again.post(p, key=key, json={"n": 1}, headers=h)
        assert is_replay(rr) and rr.content == first.content, (p, rr.status_code)
    assert stub.count() == 3


def test_admin_api_takes_the_stored_tenant(proxy, stub, pg):
    key = new_key()
    assert proxy.post("/hooks/x", key=key, json={},
                      headers={"X-Tenant-Id": "acme"}).status_code == 201
    auth = [("Authorization", "Bearer " + ADMIN_TOKEN)]
    for tenant in ("header:acme", "header%3Aacme"):
        g = raw_request(proxy.admin_port, "GET", "/admin/keys/%s/hooks/%s" % (tenant, key),
                        auth)
        assert g.status_code == 200, g.content
        assert g.json()["tenant"] == "header:acme"
    assert raw_request(proxy.admin_port, "GET", "/admin/keys/acme/hooks/" + key,
                       auth).status_code == 404


# --- 20: no forged log fields or lines --------------------------------------

FIELD = re.compile(r'([A-Za-z_]+)=("(?:[^"\\]|\\.)*"|[^ "]*)(?: |$)')


def unquote(v):
    if not v.startswith('"'):
        return v
    out, i, s = [], 0, v[1:-1]
    while i < len(s):
        c = s[i]
        if c == "\\":
            n = s[i + 1]
            if n == "x":
                out.append(chr(int(s[i + 2:i + 4], 16)))
                i += 4
                continue
            out.append({"n": "\n", "r": "\r", "t": "\t"}.get(n, n))
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def parse_fields(text):
    """logfmt: every field once, the whole text consumed."""
    fields, pos = [], 0
    for m in FIELD.finditer(text):
        assert m.start() == pos, "unparsable at %d: %r" % (pos, text)
        fields.append((m.group(1), unquote(m.group(2))))
        pos = m.end()
    assert pos == len(text), "unparsable tail %r" % text[pos:]
    names = [n for n, _ in fields]
    assert len(names) == len(set(names)), "a field appears twice: %r" % text
    return dict(fields)


def request_lines(proxy):
    return [l for l in proxy.log().splitlines() if re.match(r"\S+ info  request ", l)]


HOSTILE_KEYS = ['x outcome=replayed tenant=OTHER', 'a"b', 'back\\slash',
                'x" status=200 y="', '-', 'k=v']


def sf(key):
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


def test_text_request_line_cannot_be_forged(make_proxy, stub, pg):
    proxy = make_proxy(routes=routes_with_catch_all(), top={"log_format": "text"})
    for key in HOSTILE_KEYS:
        r = raw_request(proxy.port, "POST", PAY, [("Idempotency-Key", sf(key))], b"{}")
        assert r.status_code == 201, (key, r.content)
    path = "/other/a\"b\\c\xff\x7f=x"
    # refused (400: bytes no origin-form target may hold), and still logged
    raw_request(proxy.port, "POST", path, [], b"{}")
    lines = request_lines(proxy)
    assert len(lines) == len(HOSTILE_KEYS) + 1, proxy.log()
    for line, key in zip(lines, HOSTILE_KEYS):
        f = parse_fields(line.split(" ", 4)[4])
        assert (f["key"], f["outcome"], f["tenant"], f["status"]) == \
            (key, "forwarded", "default", "201"), line
    f = parse_fields(lines[-1].split(" ", 4)[4])
    assert f["path"] == path.encode().decode("latin-1"), lines[-1]   # the bytes sent
    assert f["outcome"] == "rejected" and f["key"] == "-"


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_admin_audit_detail_cannot_be_forged(make_proxy, stub, pg, fmt):
    proxy = make_proxy(top={"log_format": fmt})
    auth = [("Authorization", "Bearer " + ADMIN_TOKEN)]
    tenant = "x result=released operation=y"
    target = "/admin/keys/%s/hooks/k%%22%%5C%%0A" % tenant.replace(" ", "%20").replace("=", "%3D")
    r = raw_request(proxy.admin_port, "GET", target, auth)
    assert r.status_code in (400, 404), r.content
    key = new_key()
    target = "/admin/keys/%s/hooks/%s" % (tenant.replace(" ", "%20").replace("=", "%3D"), key)
    assert raw_request(proxy.admin_port, "DELETE", target, auth).status_code == 404
    lines = proxy.log().splitlines()
    if fmt == "json":
        details = [json.loads(l)["detail"] for l in lines
                   if l.startswith("{") and json.loads(l)["msg"] == "admin action"]
    else:
        details = [l.split(" admin action ", 1)[1] for l in lines if " admin action " in l]
    assert details, proxy.log()
    f = parse_fields(details[-1])
    assert (f["tenant"], f["operation"], f["key"], f["result"], f["method"]) == \
        (tenant, "hooks", key, "not_found", "DELETE"), details[-1]
