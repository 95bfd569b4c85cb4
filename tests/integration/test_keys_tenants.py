"""The Idempotency-Key header (SPEC 3.1, 3.2 steps 1-2) and the tenant part
of the scope (2.1). No rejection in steps 1-2 may write a record or reach
the upstream."""
import hashlib

import pytest

from helpers import assert_problem, is_replay, new_key, raw_request

PAY = "/v1/payments"
JSON = ("Content-Type", "application/json")


def assert_nothing_happened(stub, pg):
    assert stub.count() == 0, stub.requests()
    assert pg.records() == []


# --- step 1: no key ----------------------------------------------------------

@pytest.mark.parametrize("method", ["POST", "PATCH"])
def test_missing_key_is_400_and_writes_nothing(proxy, stub, pg, method):
    r = proxy.request(method, PAY, json={"amount": 1})
    assert_problem(r, 400, "idempotency_key_missing")
    assert_nothing_happened(stub, pg)


def test_optional_key_route_passes_through_without_a_key(proxy, stub, pg):
    r1 = proxy.post("/v1/optional", json={"n": 1})
    r2 = proxy.post("/v1/optional", json={"n": 1})
    assert r1.status_code == 201 and r2.status_code == 201
    assert not is_replay(r2)
    assert r1.json()["id"] != r2.json()["id"]
    assert stub.count(prefix="/v1/optional") == 2
    assert pg.records() == []


def test_optional_key_route_protects_requests_that_carry_a_key(proxy, stub, pg):
    key = new_key()
    r1 = proxy.post("/v1/optional", key=key, json={"n": 1})
    r2 = proxy.post("/v1/optional", key=key, json={"n": 1})
    assert r1.status_code == 201
    assert is_replay(r2) and r2.content == r1.content
    assert stub.count(key=key) == 1
    assert pg.record(key)["operation"] == "optional"


# --- step 2: invalid key -----------------------------------------------------

INVALID_KEYS = [
    ("empty", [("Idempotency-Key", "")]),
    ("blank", [("Idempotency-Key", "   ")]),
    ("empty quoted", [("Idempotency-Key", '""')]),
    ("256 chars", [("Idempotency-Key", "a" * 256)]),
    ("256 chars quoted", [("Idempotency-Key", '"' + "a" * 256 + '"')]),
    ("control char", [("Idempotency-Key", "ab\x01cd")]),
    ("DEL", [("Idempotency-Key", "ab\x7fcd")]),
    ("control char quoted", [("Idempotency-Key", '"ab\x01cd"')]),
    ("non-ASCII", [("Idempotency-Key", "caf\xc3\xa9".encode("latin-1"))]),
    ("non-ASCII quoted", [("Idempotency-Key", b'"caf\xc3\xa9"')]),
    ("list", [("Idempotency-Key", "a, b")]),
    ("sf list", [("Idempotency-Key", '"a", "b"')]),
    ("space inside bare", [("Idempotency-Key", "a b")]),
    ("bad escape", [("Idempotency-Key", '"a\\xb"')]),
    ("unterminated", [("Idempotency-Key", '"abc')]),
    ("garbage after quoted", [("Idempotency-Key", '"abc"def')]),
    ("two header lines", [("Idempotency-Key", "a"), ("Idempotency-Key", "b")]),
    ("two identical header lines", [("Idempotency-Key", "same"), ("Idempotency-Key", "same")]),
]


def test_invalid_keys_are_400_and_write_nothing(proxy, stub, pg):
    # One proxy for every case (starting one per case would dominate the
    # suite's run time); every failing case is reported, not just the first.
    failures = []
    for what, key_headers in INVALID_KEYS:
        r = raw_request(proxy.port, "POST", PAY, [JSON] + key_headers, b'{"amount":1}')
        try:
            assert_problem(r, 400, "idempotency_key_invalid")
        except AssertionError as e:
            failures.append("%s %r: %s" % (what, key_headers, e))
    assert not failures, "\n".join(failures)
    assert_nothing_happened(stub, pg)


def test_longest_keys_are_accepted(proxy, stub, pg):
    bare = "b" * 254 + "1"
    r = proxy.post(PAY, key=bare, json={"n": 1})
    assert r.status_code == 201
    assert len(pg.record(bare)["idem_key"]) == 255

    # 255 characters after unquoting (the escapes count once)
    unquoted = "q" * 253 + '"' + "\\"
    quoted = '"' + "q" * 253 + '\\"' + '\\\\' + '"'
    r = raw_request(proxy.port, "POST", PAY, [JSON, ("Idempotency-Key", quoted)], b'{"n":2}')
    assert r.status_code == 201
    assert pg.record(unquoted) is not None
    assert stub.count() == 2


def test_quoted_and_bare_forms_are_the_same_key(proxy, stub, pg):
    key = new_key()
    r1 = proxy.post(PAY, key='"%s"' % key, json={"n": 1})
    assert r1.status_code == 201
    # forwarded in its one spelling: the bare form of a valid bare value
    assert stub.requests()[0].header("Idempotency-Key") == key

    r2 = proxy.post(PAY, key=key, json={"n": 1})
    assert is_replay(r2) and r2.content == r1.content
    # sf-string parameters are ignored
    r3 = proxy.post(PAY, key='"%s";origin=retry' % key, json={"n": 1})
    assert is_replay(r3) and r3.content == r1.content
    r4 = raw_request(proxy.port, "POST", PAY,  # surrounding whitespace
                     [JSON, ("Idempotency-Key", "\t %s " % key)], b'{"n": 1}')
    assert is_replay(r4) and r4.content == r1.content

    assert stub.count() == 1
    recs = pg.records()
    assert len(recs) == 1 and recs[0]["idem_key"] == key


def test_keys_are_case_sensitive(proxy, stub, pg):
    base = new_key("Case")
    r1 = proxy.post(PAY, key=base, json={"n": 1})
    r2 = proxy.post(PAY, key=base.lower(), json={"n": 1})
    assert r1.status_code == 201 and r2.status_code == 201
    assert not is_replay(r2)
    assert stub.count() == 2
    assert {r["idem_key"] for r in pg.records()} == {base, base.lower()}


# --- 2.1: tenants ------------------------------------------------------------

HOOK = "/hooks/payment_succeeded"


def hook(proxy, key, tenant, body):
    headers = {"X-Tenant-Id": tenant} if tenant is not None else {}
    return proxy.post(HOOK, key=key, json=body, headers=headers)


def test_static_tenant_is_recorded(make_proxy, stub, pg):
    proxy = make_proxy(route_overrides={"create_payment": {"tenant": "static:acme"}})
    key = new_key()
    assert proxy.post(PAY, key=key, json={}).status_code == 201
    assert pg.record(key)["tenant"] == "acme"


def test_header_tenants_are_independent(proxy, stub, pg):
    key = new_key()
    ra = hook(proxy, key, "tenant-a", {"amount": 1})
    rb = hook(proxy, key, "tenant-b", {"amount": 2})  # another payload: no mismatch
    assert ra.status_code == 201 and rb.status_code == 201
    assert not is_replay(rb)
    assert ra.json()["id"] != rb.json()["id"]
    seen = stub.requests(key=key)
    assert [s.header("X-Tenant-Id") for s in seen] == ["tenant-a", "tenant-b"]
    recs = pg.records(key)
    assert sorted((r["tenant"], r["operation"]) for r in recs) == \
        [("header:tenant-a", "hooks"), ("header:tenant-b", "hooks")]

    ra2 = hook(proxy, key, "tenant-a", {"amount": 1})
    rb2 = hook(proxy, key, "tenant-b", {"amount": 2})
    assert is_replay(ra2) and ra2.content == ra.content
    assert is_replay(rb2) and rb2.content == rb.content
    assert_problem(hook(proxy, key, "tenant-a", {"amount": 2}), 409,
                   "idempotency_key_mismatch")
    assert stub.count(key=key) == 2


@pytest.mark.no_replay_cache
def test_in_flight_key_of_one_tenant_does_not_block_another(proxy, stub, pg):
    key = new_key()
    assert hook(proxy, key, "tenant-a", {"amount": 1}).status_code == 201
    assert pg.execute("UPDATE idempotency_records SET state = 'processing', "
                      "lease_until = now() + interval '5 minutes' WHERE idem_key = %s",
                      (key,)) == 1
    assert_problem(hook(proxy, key, "tenant-a", {"amount": 1}), 409, "idempotency_key_in_use")
    rb = hook(proxy, key, "tenant-b", {"amount": 1})
    assert rb.status_code == 201 and not is_replay(rb)
    assert stub.count(key=key) == 2


def test_missing_tenant_header_is_400_and_writes_nothing(proxy, stub, pg):
    r = hook(proxy, new_key(), None, {"amount": 1})
    assert_problem(r, 400, "tenant_missing")
    assert_nothing_happened(stub, pg)


AUTH = "/v1/auth/charges"


def charge(proxy, key, credential, body):
    headers = {"Authorization": credential} if credential is not None else {}
    return proxy.post(AUTH, key=key, json=body, headers=headers)


def test_authorization_tenants_are_independent_and_hashed(proxy, stub, pg):
    key = new_key()
    secret_a = "sk_live_alpha_" + new_key("secret")
    secret_b = "sk_live_beta_" + new_key("secret")
    cred_a, cred_b = "Bearer " + secret_a, "Bearer " + secret_b
    ra = charge(proxy, key, cred_a, {"amount": 1})
    rb = charge(proxy, key, cred_b, {"amount": 2})
    assert ra.status_code == 201 and rb.status_code == 201
    assert not is_replay(rb)
    seen = stub.requests(key=key)
    # the credential still goes upstream: it is an end-to-end header
    assert [s.header("Authorization") for s in seen] == [cred_a, cred_b]

    recs = pg.records(key)
    assert sorted(r["tenant"].lower() for r in recs) == sorted(
        "authorization:" + hashlib.sha256(c.encode()).hexdigest() for c in (cred_a, cred_b))
    dump = pg.query("SELECT t::text AS row FROM idempotency_records t")
    for row in dump:
        for secret in (secret_a, secret_b):
            assert secret not in row["row"]
    for rec in recs:
        assert secret_a.encode() not in bytes(rec["response_body"] or b"")

    ra2 = charge(proxy, key, cred_a, {"amount": 1})
    assert is_replay(ra2) and ra2.content == ra.content
    assert stub.count(key=key) == 2


def test_missing_authorization_is_401_and_writes_nothing(proxy, stub, pg):
    r = charge(proxy, new_key(), None, {"amount": 1})
    assert_problem(r, 401, "credentials_missing")
    assert_nothing_happened(stub, pg)
