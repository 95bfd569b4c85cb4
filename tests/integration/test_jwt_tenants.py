"""tenant = "jwt:CLAIM": the tenant is a claim of a bearer JWT the proxy
verifies itself against a JWKS file. A rejected token reaches neither the
upstream nor the store; the token is never stored or logged; SIGHUP
reloads the key file."""
import base64
import hashlib
import hmac
import json
import os
import signal
import time

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from conftest import run_binary
from helpers import assert_problem, is_replay, new_key, raw_request, wait_until

ISS = "https://id.example"
# The stored tenant names the issuer, escaped ('%' and ':' as %XX).
T = "jwt:https%3A//id.example:"
AUD = "payments-api"
PATH = "/v1/jwt/payments"
HS_SECRET = b"0123456789abcdef0123456789abcdef-shared"


def b64u(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


class Keys:
    """One key of each kind, made once per module."""
    def __init__(self):
        self.rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.rsa2 = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.ec = ec.generate_private_key(ec.SECP256R1())
        self.ed = ed25519.Ed25519PrivateKey.generate()

    def jwk_rsa(self, key, kid):
        d = json.loads(RSAAlgorithm.to_jwk(key.public_key()))
        d.update(kid=kid, use="sig")
        return d

    def jwks(self, rsa_keys=None):
        keys = [self.jwk_rsa(k, kid) for kid, k in (rsa_keys or [("rsa-1", self.rsa)])]
        e = json.loads(ECAlgorithm.to_jwk(self.ec.public_key()))
        e["kid"] = "ec-1"
        raw = self.ed.public_key().public_bytes(serialization.Encoding.Raw,
                                                serialization.PublicFormat.Raw)
        keys += [e, {"kty": "OKP", "crv": "Ed25519", "x": b64u(raw), "kid": "ed-1"},
                 {"kty": "oct", "k": b64u(HS_SECRET), "kid": "hs-1"}]
        return {"keys": keys}


@pytest.fixture(scope="module")
def keys():
    return Keys()


def claims(org="acme", **over):
    now = int(time.time())
    c = {"iss": ISS, "aud": AUD, "exp": now + 300, "iat": now, "org": org, "sub": "u1"}
    c.update(over)
    return {k: v for k, v in c.items() if v is not None}


def token(keys, alg="RS256", key=None, kid=None, **over):
    k = {"RS256": keys.rsa, "ES256": keys.ec, "EdDSA": keys.ed, "HS256": HS_SECRET}[alg]
    kid = kid or {"RS256": "rsa-1", "ES256": "ec-1", "EdDSA": "ed-1", "HS256": "hs-1"}[alg]
    return jwt.encode(claims(**over), key or k, algorithm=alg, headers={"kid": kid})


def write_jwks(path, doc):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.rename(tmp, path)


@pytest.fixture
def jproxy(make_proxy, stub, tmp_path, keys):
    path = str(tmp_path / "jwks.json")
    write_jwks(path, keys.jwks())
    routes = [{"name": "jwt_pay", "path": PATH, "upstream": stub.url, "tenant": "jwt:org",
               "jwt": {"keys": path, "issuer": ISS, "audience": AUD,
                       "algorithms": ["RS256", "ES256", "EdDSA", "HS256"],
                       "leeway": "5s"}},
              {"name": "plain", "path": "/v1/plain", "upstream": stub.url}]
    p = make_proxy(routes=routes)
    p.jwks_path = path
    return p


def pay(proxy, tok, key, body=None, scheme="Bearer"):
    h = {"Authorization": "%s %s" % (scheme, tok)} if tok is not None else {}
    return proxy.post(PATH, key=key, json=body or {"amount": 1}, headers=h)


def test_each_algorithm_gives_the_claim_as_tenant(jproxy, stub, pg, keys):
    for alg in ("RS256", "ES256", "EdDSA", "HS256"):
        key = new_key(alg)
        tok = token(keys, alg)
        first = pay(jproxy, tok, key)
        again = pay(jproxy, tok, key, scheme="bearer")
        assert first.status_code == 201, (alg, first.text)
        assert is_replay(again), alg
        assert stub.count(key=key) == 1
        rec = pg.record(key)
        assert rec["tenant"] == T + "acme"
        # The upstream authenticates too: it gets the token as sent.
        assert stub.requests(key=key)[0].header("Authorization") == "Bearer " + tok


def test_tenants_from_tokens_never_share_records_or_cached_answers(jproxy, stub, pg, keys):
    key = new_key()
    a = pay(jproxy, token(keys, org="acme"), key)
    # acme's answer is in the replay cache now: globex must not get it.
    b = pay(jproxy, token(keys, org="globex"), key)
    a2 = pay(jproxy, token(keys, org="acme", sub="u2"), key)
    b2 = pay(jproxy, token(keys, "ES256", org="globex"), key)
    assert not is_replay(a) and not is_replay(b)
    assert a.json()["id"] != b.json()["id"]
    assert is_replay(a2) and a2.content == a.content
    assert is_replay(b2) and b2.content == b.content
    assert stub.count(key=key) == 2
    assert sorted(r["tenant"] for r in pg.records(key)) == [T + "acme", T + "globex"]


def hs256_by_hand(header, payload, secret):
    h = b64u(json.dumps(header).encode())
    p = b64u(json.dumps(payload).encode())
    mac = hmac.new(secret, ("%s.%s" % (h, p)).encode(), hashlib.sha256).digest()
    return "%s.%s.%s" % (h, p, b64u(mac))


def rejected_tokens(keys):
    pem = keys.rsa.public_key().public_bytes(serialization.Encoding.PEM,
                                             serialization.PublicFormat.SubjectPublicKeyInfo)
    jwk_rsa = json.dumps(keys.jwk_rsa(keys.rsa, "rsa-1")).encode()
    good = token(keys)
    h, p, s = good.split(".")
    forged = json.loads(base64.urlsafe_b64decode(p + "=="))
    forged["org"] = "globex"
    return [
        ("expired", token(keys, exp=int(time.time()) - 60), "expired"),
        ("not yet valid", token(keys, nbf=int(time.time()) + 120), "not valid yet"),
        ("wrong audience", token(keys, aud="other-api"), "audience"),
        ("wrong issuer", token(keys, iss="https://evil.example"), "issuer"),
        ("no exp", token(keys, exp=None), "no \"exp\""),
        ("bad signature", "%s.%s.%s" % (h, p, s[:-4] + ("AAAA" if s[-4:] != "AAAA" else "BBBB")),
         "signature does not verify"),
        ("claims changed", "%s.%s.%s" % (h, b64u(json.dumps(forged).encode()), s),
         "signature does not verify"),
        ("another key", token(keys, key=keys.rsa2), "signature does not verify"),
        ("alg none", jwt.encode(claims(), None, algorithm="none"), "not a signed JWT"),
        ("alg none signed", "%s.%s.c2ln" % (b64u(b'{"alg":"none"}'), p),
         "\"none\" is not accepted"),
        ("HS256 with the RSA PEM", hs256_by_hand({"alg": "HS256", "kid": "rsa-1"}, claims(), pem),
         "no key of this route"),
        ("HS256 with the RSA JWK", hs256_by_hand({"alg": "HS256"}, claims(), jwk_rsa),
         "signature does not verify"),
        ("RS384", jwt.encode(claims(), keys.rsa, algorithm="RS384"), "\"RS384\" is not accepted"),
        ("garbage", "not-a-token", "not a signed JWT"),
    ]


def test_bad_tokens_are_401_credentials_invalid_and_touch_nothing(jproxy, stub, pg, keys):
    failures = []
    for what, tok, detail in rejected_tokens(keys):
        r = pay(jproxy, tok, new_key())
        try:
            assert_problem(r, 401, "credentials_invalid")
            assert detail in r.json()["detail"], r.json()["detail"]
        except AssertionError as e:
            failures.append("%s: %s" % (what, e))
    assert not failures, "\n".join(failures)
    assert stub.count() == 0, stub.requests()
    assert pg.records() == []
    # Neither a token nor a part of one is in any log line.
    log = jproxy.log()
    for _, tok, _ in rejected_tokens(keys)[:3]:
        assert tok.split(".")[2] not in log


def test_missing_credentials_and_claim(jproxy, stub, pg, keys):
    assert_problem(pay(jproxy, None, new_key()), 401, "credentials_missing")
    assert_problem(pay(jproxy, "abc", new_key(), scheme="Basic"), 401, "credentials_missing")
    r = pay(jproxy, token(keys, org=None), new_key())
    assert_problem(r, 401, "tenant_missing")
    assert "\"org\"" in r.json()["detail"]
    r = raw_request(jproxy.port, "POST", PATH,
                    [("Content-Type", "application/json"), ("Idempotency-Key", new_key()),
                     ("Authorization", "Bearer " + token(keys)),
                     ("Authorization", "Bearer " + token(keys))], b'{"a":1}')
    assert_problem(r, 400, "bad_request")
    assert stub.count() == 0
    assert pg.records() == []


def test_the_token_is_never_stored_or_logged(jproxy, stub, pg, keys):
    tok = token(keys)
    key = new_key()
    assert pay(jproxy, tok, key).status_code == 201
    assert pay(jproxy, tok, key).status_code == 201
    rows = pg.query("SELECT * FROM idempotency_records")
    assert rows and tok.split(".")[2] not in repr(rows) and tok.split(".")[1] not in repr(rows)
    assert tok.split(".")[2] not in jproxy.log()
    lines = [json.loads(l) for l in jproxy.log().splitlines() if l.startswith("{")
             and json.loads(l).get("msg") == "request"]
    assert [l["tenant"] for l in lines][-2:] == [T + "acme", T + "acme"]


def test_sighup_reloads_the_key_file(jproxy, stub, pg, keys):
    old, new = token(keys), token(keys, key=keys.rsa2, kid="rsa-2")
    assert pay(jproxy, old, new_key()).status_code == 201
    assert_problem(pay(jproxy, new, new_key()), 401, "credentials_invalid")
    # Rotation: the new key alone.
    write_jwks(jproxy.jwks_path, keys.jwks(rsa_keys=[("rsa-2", keys.rsa2)]))
    jproxy.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: pay(jproxy, new, new_key()).status_code == 201,
               what="the rotated key to be accepted")
    assert_problem(pay(jproxy, old, new_key()), 401, "credentials_invalid")
    # A key file that does not load keeps the keys in force.
    with open(jproxy.jwks_path, "w") as f:
        f.write("{not json")
    jproxy.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "reload failed" in jproxy.log(), what="the failed reload in the log")
    assert "jwks.json" in [l for l in jproxy.log().splitlines() if "reload failed" in l][-1]
    assert pay(jproxy, new, new_key()).status_code == 201
    assert jproxy.proc.poll() is None


ISS2 = "https://login.example:8443/tenant%2F7"


def set_issuer(proxy, old, new):
    """Changes the route's issuer in the proxy's conf and reloads."""
    with open(proxy.conf_path) as f:
        text = f.read()
    assert text.count('"%s"' % old) == 1, text
    with open(proxy.conf_path + ".new", "w") as f:
        f.write(text.replace('"%s"' % old, '"%s"' % new))
    os.replace(proxy.conf_path + ".new", proxy.conf_path)
    n = proxy.log().count("configuration reloaded")
    proxy.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: proxy.log().count("configuration reloaded") > n, what="the reload")


def escaped(iss):
    return iss.replace("%", "%25").replace(":", "%3A")


def test_the_same_subject_of_another_issuer_is_another_tenant(jproxy, stub, pg, keys):
    """After the route's issuer changes, a subject of the new issuer that
    happens to have the value of one of the old issuer's must not replay
    that one's answers: tenants are scoped by the issuer."""
    key = new_key()
    old = pay(jproxy, token(keys, org="123"), key)
    assert old.status_code == 201
    set_issuer(jproxy, ISS, ISS2)
    new = pay(jproxy, token(keys, org="123", iss=ISS2), key)
    assert new.status_code == 201 and not is_replay(new), new.text
    assert stub.count(key=key) == 2
    assert sorted(r["tenant"] for r in pg.records(key)) == sorted(
        ["jwt:%s:123" % escaped(ISS), "jwt:%s:123" % escaped(ISS2)])
    # each issuer's subject replays its own answer only
    again = pay(jproxy, token(keys, org="123", iss=ISS2), key)
    assert is_replay(again) and again.content == new.content
    set_issuer(jproxy, ISS2, ISS)
    again = pay(jproxy, token(keys, org="123"), key)
    assert is_replay(again) and again.content == old.content
    assert stub.count(key=key) == 2


def test_migrate_scopes_existing_jwt_tenants_by_the_issuer_once(jproxy, make_proxy, stub,
                                                                pg, keys):
    """Records written before JWT tenants named their issuer ('jwt:VALUE')
    are moved by --migrate under the issuer the conf gives their route, so
    a retry of a pre-upgrade key is still a replay; other tenants are left
    as they are."""
    key = new_key()
    tok = token(keys, org="123")
    first = pay(jproxy, tok, key)
    plain = jproxy.post("/v1/plain", key=key, json={"n": 1})
    assert first.status_code == 201 and plain.status_code == 201
    assert jproxy.stop() == 0
    # Make the database look as it did before: no issuer, no 010.
    assert pg.execute("UPDATE idempotency_records SET tenant = 'jwt:' || "
                      "substr(tenant, %s) WHERE tenant LIKE 'jwt:%%'", (len(T) + 1,)) == 1
    pg.execute("DELETE FROM schema_migrations WHERE version = 10")
    assert sorted(r["tenant"] for r in pg.records(key)) == ["default", "jwt:123"]
    r = run_binary(["-c", jproxy.conf_path, "--migrate"], env=jproxy.env)
    assert r.returncode == 0, r.stderr
    want = [("jwt_pay", T + "123"), ("plain", "default")]
    assert sorted((x["operation"], x["tenant"]) for x in pg.records(key)) == want
    assert pg.query("SELECT count(*) AS n FROM schema_migrations WHERE version = 10")[0]["n"] == 1
    assert pg.query("SELECT to_regclass('idemproxy_tenant_issuers_010') IS NULL AS gone")[0]["gone"]
    # A second run changes nothing.
    r = run_binary(["-c", jproxy.conf_path, "--migrate"], env=jproxy.env)
    assert r.returncode == 0, r.stderr
    assert sorted((x["operation"], x["tenant"]) for x in pg.records(key)) == want
    jproxy.start()
    again = pay(jproxy, tok, key)
    assert is_replay(again) and again.content == first.content
    assert stub.count(key=key) == 2  # the jwt payment and the plain one, once each


def test_check_refuses_an_issuer_too_long_for_the_stored_tenant(make_proxy, stub, tmp_path,
                                                                keys):
    path = str(tmp_path / "jwks.json")
    write_jwks(path, keys.jwks())
    # 100 ':' are 300 characters once escaped: more than a tenant holds
    iss = "urn:" + ":" * 100
    routes = [{"name": "jwt_pay", "path": PATH, "tenant": "jwt:org",
               "jwt": {"keys": path, "issuer": iss, "audience": AUD,
                       "algorithms": ["RS256"]}}]
    p = make_proxy(routes=routes, migrate=False, start=False)
    r = run_binary(["-c", p.conf_path, "--check"])
    assert r.returncode == 1
    assert "jwt.issuer is too long" in r.stderr, r.stderr
