"""Tombstones (retain_key, sql/012_tombstones.sql): a completed key kept
past its ttl refuses a late retry with 410 idempotency_key_expired and
never forwards it; another payload is still a mismatch; after retain_key
the key executes as new; the reaper strips the response at ttl and purges
the tombstone at retain_key. Time moves by rewriting the row's times with
the database's clock (replay_until: the end of the response; expires_at:
the end of the key), as the expiry tests do, rather than by sleeping."""
import signal
from datetime import timedelta

import pytest

from conftest import run_binary
from helpers import assert_problem, is_replay, new_key, render_conf, wait_until
from store_support import metrics, pay, reaper_pass, row_version
from test_ops import admin
from test_reload import reload, settings

KEPT = {"create_payment": {"ttl": "1h", "retain_key": "2h"}}


def end_response(pg, key):
    """The response's ttl passes (the key's retain_key has not)."""
    assert pg.execute("UPDATE idempotency_records SET replay_until = now() - "
                      "interval '1 second' WHERE idem_key = %s", (key,)) == 1


def end_key(pg, key):
    assert pg.execute("UPDATE idempotency_records SET expires_at = now() - "
                      "interval '1 second' WHERE idem_key = %s", (key,)) == 1


def assert_expired(resp, status):
    body = assert_problem(resp, 410, "idempotency_key_expired")
    assert body["original_status"] == status, body
    assert body["operation_state"] == "completed", body
    assert body["client_action"] == "do_not_retry", body
    assert "Idempotent-Replayed" not in resp.headers


@pytest.mark.no_replay_cache
def test_a_retry_after_ttl_is_refused_and_never_forwarded(make_proxy, stub, pg):
    proxy = make_proxy(route_overrides=KEPT)
    key = new_key()
    assert pay(proxy, key).status_code == 201
    rec = pg.record(key)
    assert pg.query("SELECT %s - %s = interval '1 hour' AS kept",
                    (rec["expires_at"], rec["replay_until"]))[0]["kept"], rec
    assert is_replay(pay(proxy, key))
    end_response(pg, key)
    before = row_version(pg, key)

    assert_expired(pay(proxy, key), 201)
    assert_problem(pay(proxy, key, {"amount": 7}), 409, "idempotency_key_mismatch")
    assert stub.count(key=key) == 1
    assert row_version(pg, key) == before, "a tombstone answer wrote to the row"

    view = admin(proxy, "GET", "default", "create_payment", key).json()
    assert view["tombstone"] is True and view["state"] == "completed", view
    assert view["response_status"] == 201 and view["expired"] is False, view


@pytest.mark.no_replay_cache
def test_after_retain_key_the_key_executes_again(make_proxy, stub, pg):
    proxy = make_proxy(route_overrides=KEPT)
    key = new_key()
    r1 = pay(proxy, key)
    assert r1.status_code == 201
    end_response(pg, key)
    assert_expired(pay(proxy, key), 201)
    end_key(pg, key)

    r2 = pay(proxy, key, {"amount": 5})
    assert r2.status_code == 201 and not is_replay(r2)
    assert r2.json()["id"] != r1.json()["id"]
    assert stub.count(key=key) == 2
    view = admin(proxy, "GET", "default", "create_payment", key).json()
    assert view["tombstone"] is False and view["attempt"] == 1, view


@pytest.mark.no_replay_cache
def test_default_retain_key_keeps_execute_as_new_after_ttl(proxy, stub, pg):
    key = new_key()
    assert pay(proxy, key).status_code == 201
    assert pg.record(key)["replay_until"] is None
    end_key(pg, key)
    r = pay(proxy, key)
    assert r.status_code == 201 and not is_replay(r)
    assert stub.count(key=key) == 2


@pytest.mark.no_replay_cache
def test_the_reaper_strips_at_ttl_and_purges_at_retain_key(make_proxy, stub, pg):
    proxy = make_proxy(route_overrides=KEPT, top={"reaper": {"interval": "200ms"}})
    a = metrics(proxy)
    key, live = new_key(), new_key("live")
    assert pay(proxy, key).status_code == 201
    assert pay(proxy, live).status_code == 201
    end_response(pg, key)

    def stripped():
        rows = pg.query("SELECT response_status, response_headers, response_body, "
                        "replay_until = '-infinity' AS gone FROM idempotency_records "
                        "WHERE idem_key = %s", (key,))
        return rows[0] if rows and rows[0]["gone"] else None
    row = wait_until(stripped, what="the reaper to strip the response")
    assert row["response_status"] == 201
    assert row["response_headers"] is None and row["response_body"] is None
    assert pg.record(live)["response_body"] is not None, "a live response was stripped"
    assert_expired(pay(proxy, key), 201)
    assert stub.count(key=key) == 1
    view = admin(proxy, "GET", "default", "create_payment", key).json()
    assert view["tombstone"] is True and view["response_body"] is None, view

    end_key(pg, key)
    wait_until(lambda: not pg.query("SELECT 1 FROM idempotency_records WHERE idem_key = %s",
                                    (key,)), what="the reaper to purge the tombstone")
    reaper_pass(pg)
    b = metrics(proxy)
    for name in ("idemproxy_reaper_tombstoned_total",
                 "idemproxy_reaper_tombstones_purged_total"):
        assert b[name] - a[name] == 1, name
    answers = 'idemproxy_tombstone_answers_total{route="create_payment"}'
    assert b[answers] - a.get(answers, 0) == 1
    assert pay(proxy, key).status_code == 201
    assert stub.count(key=key) == 2


@pytest.mark.no_replay_cache
def test_released_record_past_ttl_is_not_a_tombstone(make_proxy, stub, pg):
    """Only completed records are kept as tombstones: a released one (its
    outcome was a status the route releases) past ttl executes as new."""
    proxy = make_proxy(route_overrides=KEPT)
    key = new_key()
    stub.configure({"prefix": "/v1/payments", "key": key, "status": 503,
                    "times": 1}, append=True)
    assert pay(proxy, key).status_code == 503
    assert pg.record(key)["state"] == "released"
    end_response(pg, key)
    r = pay(proxy, key, {"amount": 3})
    assert r.status_code == 201 and not is_replay(r)
    assert stub.count(key=key) == 2


def test_retain_key_shorter_than_ttl_is_refused_at_load(make_proxy):
    proxy = make_proxy(route_overrides={"create_payment": {"ttl": "2h",
                                                           "retain_key": "1h"}},
                       migrate=False, start=False)
    r = run_binary(["-c", proxy.conf_path, "--check"])
    assert r.returncode != 0
    assert ('route "create_payment": retain_key (1h) must not be shorter than '
            'ttl (2h)') in r.stdout + r.stderr


def test_admin_view_of_a_live_record_is_not_a_tombstone(make_proxy, stub, pg):
    proxy = make_proxy(route_overrides=KEPT)
    key = new_key()
    assert pay(proxy, key).status_code == 201
    view = admin(proxy, "GET", "default", "create_payment", key).json()
    assert view["tombstone"] is False and view["response_body"], view
    assert view["response_expires_at"] < view["expires_at"], view


@pytest.mark.no_replay_cache
def test_a_record_written_before_retain_key_keeps_working(make_proxy, stub, pg):
    """A row without replay_until (as every row stored before migration
    012, or while retain_key followed ttl) read by a proxy whose route now
    keeps keys longer: replayed while it lives, executed as new after its
    expires_at, never a tombstone (its key ends with its response)."""
    before = make_proxy()
    key = new_key("old")
    r1 = pay(before, key)
    assert r1.status_code == 201
    assert pg.record(key)["replay_until"] is None
    proxy = make_proxy(route_overrides=KEPT)
    r2 = pay(proxy, key)
    assert is_replay(r2) and r2.content == r1.content
    view = admin(proxy, "GET", "default", "create_payment", key).json()
    assert view["tombstone"] is False and view["response_expires_at"] == view["expires_at"]
    end_key(pg, key)
    r3 = pay(proxy, key)
    assert r3.status_code == 201 and not is_replay(r3)
    assert stub.count(key=key) == 2


def test_the_replay_cache_never_replays_past_ttl(make_proxy, stub, pg):
    """The replay cache (on here) trusts an entry until the end of the
    response, never that of the key: once a 2 s ttl has passed, by the
    database's clock as by the proxy's, a retry is the tombstone's 410,
    though the cache would keep an entry 10 s and the key lives an hour."""
    proxy = make_proxy(route_overrides={"create_payment": {
        "ttl": "2s", "lease": "1s", "upstream_timeout": "500ms", "retain_key": "1h"}})
    key = new_key()
    assert pay(proxy, key).status_code == 201
    assert is_replay(pay(proxy, key))
    wait_until(lambda: pg.query("SELECT replay_until < now() - interval '100 ms' AS past "
                                "FROM idempotency_records WHERE idem_key = %s",
                                (key,))[0]["past"], what="the response's end")
    assert_expired(pay(proxy, key), 201)
    assert stub.count(key=key) == 1


def with_route(conf, **over):
    for r in conf["routes"]:
        if r["name"] == "create_payment":
            r.update(over)
    return conf


def test_a_reload_applies_retain_key_and_refuses_one_shorter_than_ttl(proxy, stub, pg):
    """retain_key reloads as ttl does: keys claimed after a reload follow
    it; a reload with retain_key below ttl is refused, naming both, and the
    running rule stays."""
    key = new_key("before")
    assert pay(proxy, key).status_code == 201
    assert pg.record(key)["replay_until"] is None
    reload(proxy, with_route(settings(proxy, pg, stub), ttl="1h", retain_key="2h"))
    key = new_key("after")
    assert pay(proxy, key).status_code == 201
    kept = "SELECT expires_at - replay_until AS d FROM idempotency_records WHERE idem_key = %s"
    assert pg.query(kept, (key,))[0]["d"] == timedelta(hours=1)

    with open(proxy.conf_path, "w") as f:
        f.write(render_conf(with_route(settings(proxy, pg, stub), ttl="2h",
                                       retain_key="1h")))
    proxy.proc.send_signal(signal.SIGHUP)
    why = 'retain_key (1h) must not be shorter than ttl (2h)'
    wait_until(lambda: why in proxy.log(), what="the refused reload in the log")
    assert proxy.proc.poll() is None
    key = new_key("refused")
    assert pay(proxy, key).status_code == 201
    assert pg.query(kept, (key,))[0]["d"] == timedelta(hours=1)
