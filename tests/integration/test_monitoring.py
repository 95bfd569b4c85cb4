"""What operators load next to the proxy (doc/runbook.md): the Prometheus
alert rules in conf/prometheus (checked and unit-tested with promtool), the
Grafana dashboard in conf/grafana, and the metrics they need. Every
expression in both must parse as PromQL and name only metrics, and label
values, that a running proxy actually exports after it served traffic of
every kind."""
import json
import os
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

import requests
import yaml

from conftest import ADMIN_TOKEN, ROOT
from helpers import TIMEOUT, assert_problem, free_port, is_replay, new_key, wait_until
from store_support import insert_record
from test_ops import hold_in_flight, pay, scrape, set_connections

PAY = "/v1/payments"
RULES = os.path.join(ROOT, "conf", "prometheus", "idemproxy-alerts.yml")
RULE_TESTS = os.path.join(ROOT, "conf", "prometheus", "idemproxy-alerts.test.yml")
DASHBOARD = os.path.join(ROOT, "conf", "grafana", "idemproxy-dashboard.json")
RUNBOOK = os.path.join(ROOT, "doc", "runbook.md")

# Events the proxy exports at 0 from the start, so that increase() sees the
# first one (a counter that appears at 1 has no increase yet).
EVENTS = ("record_failed", "record_fenced", "forwarded_unprotected", "replay_cache_hit",
          "overloaded", "outcome_unrecorded")


# --- the metrics the alerts need ----------------------------------------------

def test_reaper_success_timestamp_advances_and_stops_while_the_store_is_down(
        make_proxy, stub, pg):
    proxy = make_proxy(top={"reaper": {"interval": "200ms"}})
    name = "idemproxy_reaper_last_success_timestamp_seconds"
    assert scrape(proxy).types.get(name) == "gauge"
    t0 = wait_until(lambda: scrape(proxy).value(name), what="the reaper's first pass")
    assert abs(t0 - time.time()) < 3600, "%s is not a Unix time: %r" % (name, t0)
    later = wait_until(lambda: (lambda v: v if v > t0 else None)(scrape(proxy).value(name)),
                       what="the reaper's next pass")
    assert later <= time.time() + 1
    # A pass that cannot reach the store does not count: the timestamp
    # stays where the last good pass left it.
    pg.close()
    set_connections(pg, False)
    try:
        down = wait_until(lambda: (lambda e: e if e.value("idemproxy_store_up") == 0
                                   else None)(scrape(proxy)),
                          what="the reaper to find the store gone")
        stuck = down.value(name)
        time.sleep(1.0)  # five reaper intervals, each a failing pass
        assert scrape(proxy).value(name) == stuck
    finally:
        set_connections(pg, True)
    wait_until(lambda: scrape(proxy).value(name) > stuck, what="a good pass again")


def test_events_are_exported_at_zero_before_they_happen(proxy):
    m = scrape(proxy)
    for event in EVENTS:
        series = [v for lab, v in m.series("idemproxy_events_total")
                  if lab == {"event": event}]
        assert series == [0], "%s: %r" % (event, series)


def test_overloaded_requests_are_counted(make_proxy, stub, pg):
    proxy = make_proxy(top={"workers": 1, "queue_size": 1})
    stub.configure({"prefix": PAY, "gate": "busy"})
    before = scrape(proxy).value("idemproxy_events_total", event="overloaded")
    keys = [new_key("more%d" % i) for i in range(3)]
    with ThreadPoolExecutor(1 + len(keys)) as ex:
        try:
            held = ex.submit(pay, proxy, new_key("busy"), timeout=60)
            stub.wait_for(prefix=PAY)  # the only worker is busy upstream
            futs = [ex.submit(pay, proxy, k, timeout=60) for k in keys]
            shed = []
            for f in as_completed(futs, timeout=TIMEOUT * 2):
                shed.append(f.result())
                if len(shed) == len(keys) - 1:  # one waits in the queue
                    break
        finally:
            stub.release("busy")
        for r in shed:
            assert_problem(r, 503, "overloaded")
        assert held.result(timeout=60).status_code == 201
        for f in futs:
            f.result(timeout=60)
    m = scrape(proxy)
    assert m.value("idemproxy_events_total", event="overloaded") - before == len(shed)
    assert m.value("idemproxy_requests_total", outcome="rejected") == len(shed)


def test_replay_cache_size_is_exported(proxy, stub):
    m = scrape(proxy)
    for name in ("idemproxy_replay_cache_entries", "idemproxy_replay_cache_bytes"):
        assert m.types.get(name) == "gauge", name
        assert m.value(name) == 0, name
    keys = [new_key() for _ in range(2)]
    for k in keys:
        assert pay(proxy, k).status_code == 201
    m = wait_until(lambda: (lambda e: e if e.value("idemproxy_replay_cache_entries") == 2
                            else None)(scrape(proxy)), what="two cached responses")
    size = m.value("idemproxy_replay_cache_bytes")
    assert size > 2 * len(pay(proxy, keys[0]).content)
    # a replay does not add an entry; a DELETE removes one
    assert is_replay(pay(proxy, keys[0]))
    r = requests.delete("%s/admin/keys/default/create_payment/%s" % (proxy.admin_url, keys[1]),
                        headers={"Authorization": "Bearer " + ADMIN_TOKEN}, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    m = scrape(proxy)
    assert m.value("idemproxy_replay_cache_entries") == 1
    assert 0 < m.value("idemproxy_replay_cache_bytes") < size


# --- the alert rules ------------------------------------------------------------

def promtool(*args, cwd=None):
    r = subprocess.run(["promtool"] + list(args), capture_output=True, text=True,
                       timeout=120, cwd=cwd)
    return r.returncode, r.stdout + r.stderr


def load_rules():
    with open(RULES) as f:
        groups = yaml.safe_load(f)["groups"]
    return [r for g in groups for r in g["rules"]]


def runbook_anchors():
    """The anchors GitHub gives doc/runbook.md's headings."""
    anchors, in_code = set(), False
    with open(RUNBOOK) as f:
        for line in f:
            if line.startswith("```"):
                in_code = not in_code
            m = not in_code and re.match(r"^#{1,6}\s+(.*?)\s*$", line)
            if m:
                slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
                anchors.add(slug)
    return anchors


def test_alert_rules_pass_promtool_check():
    rc, out = promtool("check", "rules", RULES)
    assert rc == 0, out
    assert "SUCCESS" in out


def test_alert_rules_pass_their_promtool_unit_tests():
    rc, out = promtool("test", "rules", os.path.basename(RULE_TESTS),
                       cwd=os.path.dirname(RULE_TESTS))
    assert rc == 0, out
    assert "SUCCESS" in out


def test_every_alert_is_documented_and_unit_tested_both_ways():
    rules = load_rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names)), names
    for wanted in ("IdemproxyInstanceDown", "IdemproxyStoreUnavailable",
                   "IdemproxyStoreClaimsFailing", "IdemproxyRecordFailed",
                   "IdemproxyStuckAttempts", "IdemproxyKeyInUseRising", "IdemproxyKeyMismatch",
                   "IdemproxyUpstream5xx", "IdemproxyUpstreamOutcomeUnknown",
                   "IdemproxyOverloaded", "IdemproxyReaperNotRunning"):
        assert wanted in names, wanted
    anchors = runbook_anchors()
    for r in rules:
        a = r.get("annotations", {})
        for field in ("summary", "description", "runbook_url"):
            assert a.get(field), "%s has no %s" % (r["alert"], field)
        assert r.get("labels", {}).get("severity") in ("critical", "warning"), r["alert"]
        url = a["runbook_url"]
        assert url == "doc/runbook.md#" + r["alert"].lower(), url
        assert url.split("#", 1)[1] in anchors, "no runbook heading for %s" % url
    with open(RULE_TESTS) as f:
        cases = [c for t in yaml.safe_load(f)["tests"] for c in t["alert_rule_test"]]
    for name in names:
        mine = [c for c in cases if c["alertname"] == name]
        assert any(c["exp_alerts"] for c in mine), "%s is never tested firing" % name
        assert any(not c["exp_alerts"] for c in mine), "%s is never tested silent" % name


# --- the dashboard --------------------------------------------------------------

def load_dashboard():
    with open(DASHBOARD) as f:
        return json.load(f)


def dashboard_panels(d):
    for p in d["panels"]:
        yield p
        for q in p.get("panels", []):
            yield q


def test_dashboard_has_its_variables_and_panels():
    d = load_dashboard()
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("instance", "route"):
        assert variables[name]["type"] == "query", name
        assert variables[name]["datasource"]["uid"] == "${datasource}", name
    titles = []
    for p in dashboard_panels(d):
        if p["type"] == "row":
            continue
        titles.append(p["title"])
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
            # every panel follows the instance selection; the up series has
            # no route, the histograms neither
            assert 'instance=~"$instance"' in t["expr"], (p["title"], t["expr"])
    exprs = " ".join(t["expr"] for p in dashboard_panels(d) for t in p.get("targets", []))
    for metric in ("idemproxy_requests_total", "idemproxy_request_duration_seconds_bucket",
                   "idemproxy_store_duration_seconds_bucket",
                   "idemproxy_upstream_duration_seconds_bucket",
                   "idemproxy_processing_records", "idemproxy_oldest_processing_age_seconds",
                   "idemproxy_upstream_responses_total", "idemproxy_replay_cache_bytes",
                   "idemproxy_replay_cache_entries", 'event="replay_cache_hit"',
                   'outcome="in_flight"', 'outcome="mismatch"', "histogram_quantile(0.99"):
        assert metric in exprs, metric
    assert len(titles) == len(set(titles)), titles
    ids = [p["id"] for p in dashboard_panels(d)]
    assert len(ids) == len(set(ids)), ids


# --- every expression parses and names what the proxy exports -------------------

# words that are never metric names here (an aggregation may put its by()
# before its parenthesis, so it is not always followed by one)
FUNCTION_OR_KEYWORD = {"by", "without", "on", "ignoring", "group_left", "group_right", "and",
                       "or", "unless", "bool", "offset", "inf", "nan", "sum", "min", "max",
                       "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk",
                       "topk", "quantile"}
TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\[[^\]]*\]|\{[^}]*\}|[a-zA-Z_:][a-zA-Z0-9_:]*'
                   r'|\d+(?:\.\d+)?(?:e[+-]?\d+)?(?:ms|[smhdwy])*|\s+|.', re.S)
MATCHER = re.compile(r'\s*([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


def grafana_to_promql(expr):
    """What Prometheus receives from the dashboard: its variables replaced
    as Grafana does with All selected."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__interval", "1m")
    return re.sub(r"\$\{?(\w+)\}?", ".*", expr)


def selectors(expr):
    """(metric name or None, [(label, op, value)], grouping labels) for each
    vector selector in expr."""
    toks = [t for t in TOKEN.findall(expr) if not t.isspace()]
    out, grouping = [], set()
    i = 0
    while i < len(toks):
        t = toks[i]
        nxt = toks[i + 1] if i + 1 < len(toks) else ""
        if t in ("by", "without") and nxt == "(":
            j = toks.index(")", i)
            grouping.update(x for x in toks[i + 2:j] if x != ",")
            i = j + 1
            continue
        if re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", t):
            if nxt == "(" or t.lower() in FUNCTION_OR_KEYWORD:
                i += 1
                continue
            matchers = []
            if nxt.startswith("{"):
                matchers = parse_matchers(nxt)
                i += 1
            out.append((t, matchers))
        elif t.startswith("{"):
            out.append((None, parse_matchers(t)))
        i += 1
    return out, grouping


def parse_matchers(braces):
    body = braces[1:-1].strip().rstrip(",")
    found, pos = [], 0
    while pos < len(body):
        m = MATCHER.match(body, pos)
        assert m, "cannot read the matchers %r" % braces
        found.append(m.groups())
        pos = m.end()
    return found


def all_expressions():
    """(where, PromQL) for every rule and every dashboard query."""
    out = [("rule %s" % r["alert"], r["expr"]) for r in load_rules()]
    d = load_dashboard()
    for p in dashboard_panels(d):
        for t in p.get("targets", []):
            out.append(("panel %r" % p["title"], grafana_to_promql(t["expr"])))
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\)\s*", v["query"]["query"])
            assert m, "variable %s: %r" % (v["name"], v["query"])
            out.append(("variable %s" % v["name"], grafana_to_promql(m.group(1))))
    return out


def test_every_expression_parses_as_promql(tmp_path):
    exprs = all_expressions()
    rules = {"groups": [{"name": "parse", "rules": [
        {"record": "idemproxy_check:expr_%d" % i, "expr": e} for i, (_, e) in enumerate(exprs)]}]}
    path = tmp_path / "parse.yml"
    path.write_text(yaml.safe_dump(rules))
    rc, out = promtool("check", "rules", str(path))
    assert rc == 0, out
    assert "%d rules found" % len(exprs) in out, out
    # the check is not vacuous: a broken expression fails it
    path.write_text(yaml.safe_dump({"groups": [{"name": "parse", "rules": [
        {"record": "idemproxy_check:broken", "expr": "sum by (route (rate(x[5m]))"}]}]}))
    assert promtool("check", "rules", str(path))[0] != 0


def serve_every_kind(make_proxy, stub, pg):
    dead = "http://127.0.0.1:%d" % free_port()
    proxy = make_proxy(routes=[
        {"name": "create_payment", "path": PAY},
        {"name": "dead", "path": "/v1/dead", "upstream": dead},
    ], top={"reaper": {"interval": "200ms"}})
    key = new_key()
    assert pay(proxy, key).status_code == 201                          # forwarded
    assert is_replay(pay(proxy, key))                                  # replayed
    assert pay(proxy, key, {"amount": 1}).status_code == 409           # mismatch
    assert pay(proxy, new_key(), path="/v1/dead").status_code == 502   # upstream_unavailable
    lost = new_key()
    stub.configure({"prefix": PAY, "key": lost, "action": "reset"})
    assert pay(proxy, lost).status_code == 504                         # outcome_unknown
    again = new_key()
    stub.configure({"prefix": PAY, "key": again, "status": 503, "times": 1})
    assert pay(proxy, again).status_code == 503                        # upstream 5xx
    assert pay(proxy, again).status_code == 201                        # takeover
    busy = new_key()
    t, out = hold_in_flight(proxy, stub, busy, "busy")
    try:
        assert pay(proxy, busy).status_code == 409                     # in_flight
    finally:
        stub.release("busy")
        t.join(TIMEOUT)
    assert out and out[0].status_code == 201
    insert_record(pg, new_key(), state="processing", lease="now() + interval '1 hour'",
                  tenant="gauge")
    pg.close()
    set_connections(pg, False)
    try:
        assert_problem(pay(proxy, new_key()), 503, "idempotency_store_unavailable")
    finally:
        set_connections(pg, True)
    return wait_until(lambda: (lambda e: e if e.value("idemproxy_store_up") == 1
                               and e.value("idemproxy_processing_records") >= 1 else None)(
        scrape(proxy)), what="the store back and the processing gauge refreshed")


def test_every_expression_names_what_a_running_proxy_exports(make_proxy, stub, pg):
    m = serve_every_kind(make_proxy, stub, pg)
    exported = {}
    for name, labels, _ in m.samples:
        exported.setdefault(name, []).append(labels)
    # the up series is Prometheus's own, one per scraped target
    exported["up"] = [{}]
    added_by_prometheus = {"job", "instance"}
    for where, expr in all_expressions():
        sels, grouping = selectors(expr)
        assert sels, "%s names no metric: %s" % (where, expr)
        known_labels = set(added_by_prometheus) | {"le"}
        for name, matchers in sels:
            assert name is not None, "%s: a selector without a metric name: %s" % (where, expr)
            assert name in exported, "%s: %s is not exported by the proxy" % (where, name)
            for lab in exported[name]:
                known_labels.update(lab)
            for label, op, value in matchers:
                if label in added_by_prometheus:
                    continue
                have = {lab.get(label) for lab in exported[name]}
                assert have - {None}, "%s: %s has no label %s" % (where, name, label)
                if op == "=":
                    wanted = [value]
                elif op == "=~" and re.fullmatch(r"\w+(\|\w+)*", value):
                    wanted = value.split("|")
                else:
                    continue
                for w in wanted:
                    assert w in have, "%s: no %s{%s=%r} after serving every kind of " \
                        "request (exported: %s)" % (where, name, label, w, sorted(have - {None}))
        unknown = grouping - known_labels
        assert not unknown, "%s groups by %s, which its metrics do not carry" % (where, unknown)


# Series the alert rules and the dashboard select by route: at 0 for every
# route from the start, so that rate() and increase() see the first event.
ROUTE_SERIES = [("idemproxy_takeovers_total", {}),
                ("idemproxy_requests_total", {"outcome": "in_flight"}),
                ("idemproxy_requests_total", {"outcome": "mismatch"}),
                ("idemproxy_requests_total", {"outcome": "store_unavailable"}),
                ("idemproxy_requests_total", {"outcome": "upstream_unavailable"}),
                ("idemproxy_requests_total", {"outcome": "outcome_unknown"}),
                ("idemproxy_upstream_responses_total", {"class": "5xx"})]


def route_series(proxy, route):
    m = scrape(proxy)
    return {(name, tuple(sorted(extra.items()))): [
        v for lab, v in m.series(name) if lab == dict(extra, route=route)]
        for name, extra in ROUTE_SERIES}


def test_route_series_are_exported_at_zero_before_their_first_event(make_proxy, stub, pg):
    from test_reload import reload, settings
    proxy = make_proxy()
    for route in ("create_payment", "capture", "refund", "optional", "hooks", "auth"):
        got = route_series(proxy, route)
        assert all(v == [0] for v in got.values()), (route, got)
    # a route a reload adds is exported at once too
    conf = settings(proxy, pg, stub)
    conf["routes"].append({"name": "payouts", "path": "/v1/payouts", "upstream": stub.url})
    reload(proxy, conf)
    got = route_series(proxy, "payouts")
    assert all(v == [0] for v in got.values()), got
    # and the first event counts from there
    key = new_key()
    assert proxy.post("/v1/payouts", key=key, json={"a": 1}).status_code == 201
    assert_problem(proxy.post("/v1/payouts", key=key, json={"a": 2}), 409,
                   "idempotency_key_mismatch")
    got = route_series(proxy, "payouts")
    assert got[("idemproxy_requests_total", (("outcome", "mismatch"),))] == [1], got
    assert stub.count(key=key) == 1
