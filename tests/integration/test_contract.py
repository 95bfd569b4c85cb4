"""The contract (doc/contract.md): `--contract` prints an OpenAPI 3.1
document of the conf's idempotency rules, from the conf alone; a real
OpenAPI validator (tests/contract, pinned by its lock file) accepts it for
the example conf and for a conf that uses every feature; its routes, codes
and rules are the conf's; the problem codes it lists are the ones the source
can answer; the admin listener and (with contract_path) the public listener
serve the configuration in force, and follow a reload; doc/contract.md
holds what the binary prints for the example conf."""
import base64
import json
import os
import re
import shutil
import subprocess

import pytest
import requests

from conftest import ADMIN_TOKEN, ROOT, run_binary
from helpers import assert_problem, log_entries, render_conf, wait_until

EXAMPLE = os.path.join(ROOT, "conf", "idemproxy.conf")
NODE_DIR = os.path.join(ROOT, "build", "contract-node")
VALIDATE = os.path.join(ROOT, "tests", "contract", "validate.js")
ADMIN = {"Authorization": "Bearer " + ADMIN_TOKEN}


@pytest.fixture(scope="module")
def validator():
    """Runs the validator on a document; fails (never skips) without node."""
    assert shutil.which("node"), \
        "node is missing: the contract tests validate with a Node OpenAPI " \
        "validator; run `make deps` (Debian packages nodejs and npm)"
    r = subprocess.run(["make", "-s", "-C", ROOT, "contract-deps"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, "make contract-deps failed:\n%s%s" % (r.stdout, r.stderr)

    def validate(doc, tmp_path, name="contract.json"):
        path = str(tmp_path / name)
        with open(path, "w") as f:
            f.write(doc if isinstance(doc, str) else json.dumps(doc))
        env = dict(os.environ, NODE_PATH=os.path.join(NODE_DIR, "node_modules"))
        v = subprocess.run(["node", VALIDATE, path], capture_output=True, text=True,
                           timeout=120, env=env)
        return v.returncode, v.stdout + v.stderr
    return validate


def contract_of(conf_path):
    # No database and no network: the URL names nothing that runs.
    env = dict(os.environ, IDEMPROXY_DATABASE_URL="postgresql://nobody@127.0.0.1:1/none")
    r = run_binary(["-c", conf_path, "--contract"], env=env)
    assert r.returncode == 0, "--contract failed (%d): %s" % (r.returncode, r.stderr)
    return r.stdout


def operations(doc):
    """(path, method, operation) of every operation, extension ones too."""
    out = []
    for path, item in doc["paths"].items():
        for m, op in item.items():
            if m in ("get", "put", "post", "delete", "options", "head", "patch", "trace"):
                out.append((path, m.upper(), op))
        for m, op in item.get("x-idempotency-methods", {}).items():
            out.append((path, m, op))
    return out


def problems_of(doc, op):
    """{status: [codes]} of an operation's problem responses."""
    out = {}
    for status, resp in op["responses"].items():
        if status == "default":
            continue
        name = resp["$ref"].rsplit("/", 1)[1]
        body = doc["components"]["responses"][name]["content"]["application/problem+json"]
        parts = body["schema"]["allOf"]
        assert parts[0] == {"$ref": "#/components/schemas/idemproxy_Problem"}
        assert parts[1]["properties"]["status"]["const"] == int(status)
        out[int(status)] = parts[1]["properties"]["code"]["enum"]
    return out


def check_path_parameters(doc):
    for path, item in doc["paths"].items():
        declared = sorted(p["name"] for p in item.get("parameters", []) if p["in"] == "path")
        assert declared == sorted(re.findall(r"\{([^}]+)\}", path)), path


def check_names(doc):
    for _, _, op in operations(doc):
        assert op["operationId"].startswith("idemproxy_")
    for kind, names in doc["components"].items():
        for n in names:
            assert n.startswith("idemproxy_"), (kind, n)
    ids = [op["operationId"] for _, _, op in operations(doc)]
    assert len(ids) == len(set(ids))


def test_example_conf_is_valid_openapi_with_its_routes(validator, tmp_path):
    text = contract_of(EXAMPLE)
    rc, out = validator(text, tmp_path)
    assert rc == 0, out
    doc = json.loads(text)
    assert doc["openapi"] == "3.1.0"
    top = doc["x-idempotency"]
    assert top["proxy"] == "idemproxy"
    assert top["specification"] == "draft-ietf-httpapi-idempotency-key-header-07"
    assert top["version"] == run_binary(["--version"]).stdout.split()[1]
    check = run_binary(["-c", EXAMPLE, "--check"]).stdout.splitlines()[1:]
    routes = {l.split()[0]: l.split()[1] for l in check}
    got = {op["x-idempotency"]["operation"]: op["x-idempotency"]["path_template"]
           for _, _, op in operations(doc)}
    assert got == routes
    assert {(p, m) for p, m, _ in operations(doc)} == \
        {(p.replace("/*", "/{idemproxy_rest}"), m) for p in routes.values()
         for m in ("POST", "PATCH")}
    check_path_parameters(doc)
    check_names(doc)
    capture = doc["paths"]["/v1/payments/{id}/capture"]["post"]
    assert capture["operationId"] == "idemproxy_capture_payment_post"
    assert capture["x-idempotency"]["ttl_ms"] == 7 * 86400 * 1000
    assert capture["x-idempotency"]["expiry"] == {"ttl_ms": 7 * 86400 * 1000,
                                                  "after_ttl": "executes_as_new"}
    key = capture["parameters"][0]
    assert (key["name"], key["in"], key["required"]) == ("Idempotency-Key", "header", True)
    psp = doc["paths"]["/hooks/psp"]["post"]
    assert psp["parameters"] == []
    assert psp["x-idempotency"]["store_unreachable"] == {
        "mode": "reject", "status": 503, "code": "idempotency_store_unavailable"}
    assert "when_absent" not in psp["x-idempotency"]["key"]
    assert psp["x-idempotency"]["key"]["parts"] == [{"in": "body", "pointer": "/event/id"}]
    bank = doc["paths"]["/hooks/bank"]["post"]
    assert [(p["name"], p["in"]) for p in bank["parameters"]] == [("X-Delivery-Id", "header")]
    orders = doc["paths"]["/v1/orders/{id}/transitions"]["patch"]["x-idempotency"]
    assert orders["fingerprint"]["ignore"] == ["/sent_at"]
    schema = doc["components"]["schemas"]
    assert schema["idemproxy_OperationState"]["enum"] == [
        "not_executed", "in_progress", "unknown", "completed"]
    assert schema["idemproxy_ClientAction"]["enum"] == [
        "retry_same_key", "retry_new_key", "fix_request", "do_not_retry"]
    for member in ("operation_state", "client_action", "request_id", "code"):
        assert member in schema["idemproxy_Problem"]["properties"]


def hs_jwks(path):
    with open(path, "w") as f:
        json.dump({"keys": [{"kty": "oct", "kid": "hs-1", "k": base64.urlsafe_b64encode(
            b"0123456789abcdef0123456789abcdef").rstrip(b"=").decode()}]}, f)


def every_feature_conf(tmp_path, extra=None):
    """A conf with every kind of tenant, key and in-flight rule, and a route
    that an earlier one shadows (left out of the document)."""
    jwks = str(tmp_path / "jwks.json")
    hs_jwks(jwks)
    up = "http://127.0.0.1:9"
    settings = {
        "listen": "127.0.0.1:18080", "admin_listen": "127.0.0.1:18081",
        "database": {"url": "postgresql://nobody@127.0.0.1:1/none",
                     "unavailable": "forward"},
        "routes": [
            {"name": "jwt_pay", "path": "/v1/jwt/{account}/payments", "upstream": up,
             "tenant": "jwt:org_id",
             "jwt": {"keys": jwks, "issuer": "https://id.example.com",
                     "audience": "payments-api", "algorithms": ["HS256"]},
             "in_flight": "wait", "wait_max": "5s", "on_unknown": "hold"},
            {"name": "hooks", "path": "/hooks/*", "upstream": up, "methods": ["POST", "CONNECT"],
             "tenant": "header:X-Tenant-Id",
             "key_from": ["header:X-Delivery-Id", "query:attempt", "body:/event/id"],
             "key": "optional", "store_body": "status_only",
             "fingerprint_only": ["/event"]},
            {"name": "auth_put", "path": "/v1/auth/{id}", "upstream": up, "methods": ["PUT"],
             "tenant": "authorization", "mismatch_status": 422,
             "release_statuses": [503], "fingerprint_headers": ["X-Client"],
             "ttl": "2d", "retain_key": "30d", "lease": "20s",
             "upstream_timeout": "10s"},
            {"name": "shadowed", "path": "/v1/auth/{other}", "upstream": up},
        ],
    }
    settings.update(extra or {})
    path = str(tmp_path / "every.conf")
    with open(path, "w") as f:
        f.write(render_conf(settings))
    return path


def test_every_feature_conf_is_valid_openapi_with_its_rules(validator, tmp_path):
    text = contract_of(every_feature_conf(tmp_path))
    rc, out = validator(text, tmp_path)
    assert rc == 0, out
    doc = json.loads(text)
    ops = {(p, m): op for p, m, op in operations(doc)}
    assert set(ops) == {("/v1/jwt/{account}/payments", "POST"),
                        ("/v1/jwt/{account}/payments", "PATCH"),
                        ("/hooks/{idemproxy_rest}", "POST"),
                        ("/hooks/{idemproxy_rest}", "CONNECT"),
                        ("/v1/auth/{id}", "PUT")}
    check_path_parameters(doc)
    check_names(doc)

    jwt = ops[("/v1/jwt/{account}/payments", "POST")]
    rules = jwt["x-idempotency"]
    assert rules["scope"]["tenant"] == {"source": "jwt", "claim": "org_id",
                                        "issuer": "https://id.example.com",
                                        "audience": "payments-api"}
    assert rules["in_flight"]["mode"] == "wait" and rules["in_flight"]["wait_max_ms"] == 5000
    assert rules["on_unknown"]["mode"] == "hold"
    assert rules["store_unreachable"]["mode"] == "forward"
    assert rules["store_unreachable"]["store_error"] == "503 idempotency_store_unavailable"
    assert jwt["security"] == [{"idemproxy_jwt": []}]
    assert doc["components"]["securitySchemes"]["idemproxy_jwt"]["scheme"] == "bearer"
    p = problems_of(doc, jwt)
    assert sorted(p[401]) == ["credentials_invalid", "credentials_missing", "tenant_missing"]
    assert "tenant_missing" not in p[400]
    assert "idempotency_key_mismatch" in p[409]
    assert 410 not in p  # its retain_key is its ttl: no tombstones

    hooks = ops[("/hooks/{idemproxy_rest}", "CONNECT")]
    rules = hooks["x-idempotency"]
    assert rules["key"]["required"] is False
    assert rules["key"]["when_absent"] == "forwarded without idempotency protection"
    assert rules["key"]["parts"] == [{"in": "header", "name": "X-Delivery-Id"},
                                     {"in": "query", "name": "attempt"},
                                     {"in": "body", "pointer": "/event/id"}]
    assert [(x["name"], x["in"], x["required"]) for x in hooks["parameters"]] == \
        [("X-Delivery-Id", "header", False), ("attempt", "query", False)]
    assert rules["scope"]["tenant"] == {"source": "header", "header": "X-Tenant-Id"}
    assert rules["replay"]["body"] == "status_only"
    assert rules["fingerprint"]["only"] == ["/event"]
    p = problems_of(doc, hooks)
    assert "tenant_missing" in p[400] and "idempotency_key_missing" not in p[400]
    assert 401 not in p

    auth = ops[("/v1/auth/{id}", "PUT")]
    rules = auth["x-idempotency"]
    assert (rules["ttl_ms"], rules["lease_ms"], rules["upstream_timeout_ms"]) == \
        (2 * 86400000, 20000, 10000)
    assert rules["released_statuses"] == [503]
    assert rules["fingerprint"]["mismatch_status"] == 422
    assert "X-Client" in rules["fingerprint"]["covers"]
    assert rules["in_flight"]["mode"] == "reject"
    p = problems_of(doc, auth)
    assert sorted(p[422]) == ["idempotency_key_mismatch", "idempotency_operation_completed"]
    assert p[410] == ["idempotency_key_expired"]
    assert rules["expiry"] == {"ttl_ms": 2 * 86400000, "retain_key_ms": 30 * 86400000,
                               "after_ttl": {"answer": "refused", "status": 410,
                                             "code": "idempotency_key_expired",
                                             "forwarded": False},
                               "after_retain_key": "executes_as_new"}
    assert "idempotency_key_mismatch" not in p[409]
    assert p[401] == ["credentials_missing"]


# The files whose answers are a route's; admin.c answers the admin API, and
# reply.c's method_not_allowed is the contract path's own.
ROUTE_SOURCES = ("http_front.c", "decide.c", "proxy.c")
PAIR = re.compile(r'\b(\d{3}|mismatch_status),\s*"([a-z_]+)"')


def source_problems():
    found = set()
    for name in ROUTE_SOURCES:
        with open(os.path.join(ROOT, "src", name)) as f:
            for status, code in PAIR.findall(f.read()):
                statuses = (409, 422) if status == "mismatch_status" else (int(status),)
                found.update((s, code) for s in statuses)
    return found


def test_the_codes_listed_are_the_codes_the_source_answers(tmp_path):
    """Every (status, code) the request path can answer is in the document
    of a conf that enables them all, and nothing else is; a code added to
    the source without its row in src/contract.c fails here."""
    src = source_problems()
    assert (409, "idempotency_key_in_use") in src and len(src) > 15
    listed = set()
    for extra in ({}, {"defaults": {"mismatch_status": 422}}):
        doc = json.loads(contract_of(every_feature_conf(tmp_path, extra)))
        for _, _, op in operations(doc):
            listed.update((s, c) for s, codes in problems_of(doc, op).items() for c in codes)
    unmatched = doc["x-idempotency"]["unmatched_paths"]
    listed.add((unmatched["status"], unmatched["code"]))
    assert src - listed == set(), "answered by the source, missing from the contract"
    assert listed - src == set(), "in the contract, never answered by the source"


@pytest.mark.parametrize("path,why", [
    ("/v1/payments", 'is a path of route "create_payment"'),
    ("/hooks/anything", 'is a path of route "hooks"'),
    ("/openapi.json/", "write it as requests are routed"),
    ("openapi.json", "it must start with '/'"),
    ("/openapi.json?x=1", "no query"),
])
def test_a_contract_path_a_request_could_not_reach_is_refused(make_proxy, path, why):
    p = make_proxy(top={"contract_path": path}, migrate=False, start=False)
    r = run_binary(["-c", p.conf_path, "--check"], env=p.env)
    assert r.returncode == 1
    assert "contract_path" in r.stderr and why in r.stderr, r.stderr


def admin_get(proxy, path):
    return requests.get(proxy.admin_url + path, headers=ADMIN, timeout=10)


def reload_with(proxy, top=None, ttl=None):
    """Rewrites the proxy's conf with top-level changes (None deletes) and a
    ttl on create_payment, sends SIGHUP, waits for the reload."""
    with open(proxy.conf_path) as f:
        conf = f.read()
    for k, v in (top or {}).items():
        conf = re.sub(r"(?m)^%s = .*\n" % k, "", conf)
        if v is not None:
            conf = '%s = "%s";\n' % (k, v) + conf
    if ttl:
        conf = conf.replace('name = "create_payment";', 'name = "create_payment";\n'
                            '    ttl = "%s";' % ttl)
    done = proxy.log().count("configuration reloaded")
    with open(proxy.conf_path + ".new", "w") as f:
        f.write(conf)
    os.replace(proxy.conf_path + ".new", proxy.conf_path)
    proxy.proc.send_signal(__import__("signal").SIGHUP)
    wait_until(lambda: proxy.log().count("configuration reloaded") > done, what="the reload")


def test_the_listeners_serve_the_contract_in_force(make_proxy, stub, pg, validator, tmp_path):
    proxy = make_proxy(top={"contract_path": "/openapi.json"})
    printed = contract_of(proxy.conf_path)
    r = admin_get(proxy, "/admin/contract")
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/json"
    assert r.text == printed
    assert requests.get(proxy.admin_url + "/admin/contract", timeout=10).status_code == 401
    rules = admin_get(proxy, "/admin/contract/rules").json()
    assert rules["x-idempotency"] == json.loads(printed)["x-idempotency"]
    assert [x["operation"] for x in rules["routes"]] == \
        ["create_payment", "capture", "refund", "optional", "hooks", "auth"]
    assert {"status": 409, "code": "idempotency_key_in_use"} in rules["routes"][0]["problems"]

    pub = proxy.get("/openapi.json")
    assert pub.status_code == 200 and pub.headers["Content-Type"] == "application/json"
    assert pub.text == printed
    rc, out = validator(pub.text, tmp_path)
    assert rc == 0, out
    head = requests.head(proxy.url + "/openapi.json", timeout=10)
    assert head.status_code == 200 and head.content == b""
    post = proxy.post("/openapi.json", key="k-contract", json={})
    assert_problem(post, 405, "method_not_allowed")
    assert post.headers["Allow"] == "GET, HEAD"
    served = [e for e in log_entries(proxy) if e.get("path") == "/openapi.json"]
    assert [(e["status"], e["outcome"]) for e in served] == \
        [(200, "contract"), (200, "contract"), (405, "rejected")]
    assert stub.count() == 0 and pg.records() == []

    reload_with(proxy, ttl="3h")
    ttl = json.loads(proxy.get("/openapi.json").text)["paths"]["/v1/payments"]["post"]
    assert ttl["x-idempotency"]["ttl_ms"] == 3 * 3600 * 1000
    assert admin_get(proxy, "/admin/contract").text == proxy.get("/openapi.json").text
    assert admin_get(proxy, "/admin/contract/rules").json()["routes"][0]["ttl_ms"] == 3 * 3600000

    reload_with(proxy, top={"contract_path": None})
    assert_problem(proxy.get("/openapi.json"), 404, "route_not_found")
    assert admin_get(proxy, "/admin/contract").status_code == 200
    assert stub.count() == 0 and pg.records() == []


def test_the_documentation_holds_what_the_binary_prints():
    with open(os.path.join(ROOT, "doc", "contract.md")) as f:
        page = f.read()
    m = re.search(r"<!-- contract of conf/idemproxy.conf -->\n```json\n(.*?)```\n", page, re.S)
    assert m, "doc/contract.md has no marked copy of the example's contract"
    assert m.group(1) == contract_of(EXAMPLE), \
        "doc/contract.md differs from `idemproxy -c conf/idemproxy.conf --contract`: run scripts/contract-doc.py"
