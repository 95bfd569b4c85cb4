"""What the store offers for the one-effect promise across a failover:
synchronous standbys or none, logged at start, on reload, when the
store connection lands on another server and when a periodic check finds
it changed, and exported as gauges."""
import signal

import pytest

from helpers import log_entries, wait_until
from pg_standby import APP_NAME, running_pair
from store_support import metrics

SYNC = "store durability: commits wait for a synchronous standby"
NONE = "store durability: no synchronous standby"
STANDBYS = "idemproxy_store_synchronous_standbys"
COUNTED = "idemproxy_store_synchronous_standbys_counted"
LAST_PASS = "idemproxy_reaper_last_success_timestamp_seconds"


def commit_level(m, level):
    return m['idemproxy_store_synchronous_commit{level="%s"}' % level]


def durability_lines(proxy):
    return [d for d in log_entries(proxy)
            if d.get("msg", "").startswith("store durability")]


def checked(proxy, n=1):
    """The durability lines, once there are n of them (and the gauges set
    with the last: they are set before its line is logged)."""
    return wait_until(lambda: (lambda l: l if len(l) >= n else None)(
        durability_lines(proxy)), what="%d store durability line(s)" % n)


@pytest.fixture
def pair(tmp_path, request):
    with running_pair(tmp_path, sync=request.param) as p:
        yield p


def proxy_on(make_proxy, url, migrate=False, **top):
    return make_proxy(migrate=migrate, top=dict({"database": {"url": url}}, **top))


@pytest.mark.parametrize("options, commit, reason", [
    # the shared cluster runs with synchronous_commit = off
    ("", "off", "synchronous_commit does not wait for a standby"),
    ("?options=-csynchronous_commit%3Don", "on", "synchronous_standby_names is empty"),
])
def test_a_store_without_a_standby_warns_and_exports_zero(make_proxy, pg, options,
                                                          commit, reason):
    proxy = proxy_on(make_proxy, pg.url + options, migrate=True)
    [line] = checked(proxy)
    assert line["level"] == "warn" and line["msg"].startswith(NONE), line
    assert "a key can then execute twice" in line["msg"], line
    assert "why=start" in line["detail"] and 'reason="%s"' % reason in line["detail"], line
    assert "synchronous_commit=%s " % commit in line["detail"], line
    m = metrics(proxy)
    assert m[STANDBYS] == 0 and m[COUNTED] == 1, m
    assert commit_level(m, commit) == 1 and commit_level(m, "remote_apply") == 0, m


@pytest.mark.parametrize("pair", [True], indirect=True)
def test_a_synchronous_standby_is_stated_without_a_warning(make_proxy, pair):
    proxy = proxy_on(make_proxy, pair.url)
    [line] = checked(proxy)
    assert line["level"] == "info" and line["msg"] == SYNC, line
    assert "synchronous_standbys=1 counted=pg_stat_replication" in line["detail"], line
    assert "server=127.0.0.1:%d" % pair.primary_port in line["detail"], line
    m = metrics(proxy)
    assert m[STANDBYS] >= 1 and m[COUNTED] == 1 and commit_level(m, "on") == 1, m


@pytest.mark.parametrize("pair", [False], indirect=True)
def test_an_asynchronous_standby_warns_until_a_reload_finds_it_synchronous(
        make_proxy, pair):
    proxy = proxy_on(make_proxy, pair.url)
    [line] = checked(proxy)
    # A standby streams, but commits do not wait for it.
    assert line["level"] == "warn" and line["msg"].startswith(NONE), line
    assert 'reason="synchronous_standby_names is empty"' in line["detail"], line
    assert metrics(proxy)[STANDBYS] == 0
    # The primary's settings change; the proxy learns of it at its reload.
    pair.primary.query("ALTER SYSTEM SET synchronous_standby_names = '%s'" % APP_NAME)
    pair.primary.query("SELECT pg_reload_conf()")
    pair.sync = True
    pair.wait_streaming()
    proxy.proc.send_signal(signal.SIGHUP)
    lines = checked(proxy, 2)
    assert lines[1]["level"] == "info" and lines[1]["msg"] == SYNC, lines
    assert "why=reload" in lines[1]["detail"], lines
    assert metrics(proxy)[STANDBYS] == 1


@pytest.mark.parametrize("pair", [True], indirect=True)
def test_a_role_that_cannot_see_sync_state_counts_what_the_settings_ask(
        make_proxy, pair):
    # pg_stat_replication shows its sync_state only to pg_read_all_stats.
    pair.primary.query("CREATE ROLE idem_app LOGIN")
    pair.primary.query("GRANT USAGE ON SCHEMA public TO idem_app", db=pair.db)
    pair.primary.query("GRANT ALL ON ALL TABLES IN SCHEMA public TO idem_app", db=pair.db)
    pair.primary.query("GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO idem_app", db=pair.db)
    url = pair.url.replace("postgresql://postgres@", "postgresql://idem_app@")
    proxy = proxy_on(make_proxy, url)
    [line] = checked(proxy)
    assert line["level"] == "info" and line["msg"] == SYNC, line
    assert "synchronous_standbys=1 counted=synchronous_standby_names" in line["detail"], line
    m = metrics(proxy)
    assert m[STANDBYS] == 1 and m[COUNTED] == 0, m


@pytest.mark.parametrize("pair", [True], indirect=True)
def test_a_failover_to_a_primary_without_a_standby_warns(make_proxy, pair):
    proxy = proxy_on(make_proxy, pair.url, reaper={"interval": "200ms"})
    [line] = checked(proxy)
    assert line["level"] == "info", line
    pair.kill_primary()
    pair.promote()   # which leaves synchronous_standby_names empty
    lines = [l for l in checked(proxy, 2) if "why=new_server" in l["detail"]]
    assert lines, durability_lines(proxy)
    assert lines[0]["level"] == "warn" and lines[0]["msg"].startswith(NONE), lines
    assert "server=127.0.0.1:%d" % pair.standby_port in lines[0]["detail"], lines
    assert metrics(proxy)[STANDBYS] == 0


def test_a_reconnect_to_the_same_server_is_logged_only_when_it_changed(make_proxy, pg):
    proxy = proxy_on(make_proxy, pg.url, migrate=True, reaper={"interval": "200ms"})
    [line] = checked(proxy)
    assert "synchronous_commit=off " in line["detail"], line

    def cut_and_wait_for_reconnect():
        pg.query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                 "WHERE datname = current_database() AND application_name = 'idemproxy' "
                 "AND pid <> pg_backend_pid()")
        # Of the passes that end after the cut, the first may have run on
        # the old connection; the second ran on a new one, and its check
        # had ended once a third one ends.
        seen = [metrics(proxy)[LAST_PASS]]
        wait_until(lambda: seen.append(metrics(proxy)[LAST_PASS]) or
                   len(set(seen)) > 3, what="three reaper passes after the cut")

    # The same settings on a new connection: nothing to say.
    cut_and_wait_for_reconnect()
    # New sessions of this database get synchronous_commit = on.
    pg.execute("ALTER DATABASE %s SET synchronous_commit = on" % pg.name)
    cut_and_wait_for_reconnect()
    lines = checked(proxy, 2)
    assert len(lines) == 2, lines
    assert lines[1]["level"] == "warn" and "why=reconnect" in lines[1]["detail"], lines
    assert 'reason="synchronous_standby_names is empty"' in lines[1]["detail"], lines
    m = metrics(proxy)
    assert commit_level(m, "on") == 1 and commit_level(m, "off") == 0, m


@pytest.mark.parametrize("pair", [True], indirect=True)
def test_a_standby_that_stops_is_noticed_without_a_reload(make_proxy, pair):
    # No reaper pass and no SIGHUP after the start: only the periodic check
    # can see the standby go and come back.
    proxy = proxy_on(make_proxy, pair.url,
                     reaper={"interval": "1h", "durability_interval": "200ms"})
    [line] = checked(proxy)
    assert line["level"] == "info" and "synchronous_standbys=1 " in line["detail"], line
    assert metrics(proxy)[STANDBYS] == 1
    pair.standby.stop()
    lines = checked(proxy, 2)
    assert lines[1]["level"] == "warn" and lines[1]["msg"].startswith(NONE), lines
    assert "why=periodic" in lines[1]["detail"], lines
    assert 'reason="no synchronous standby is attached"' in lines[1]["detail"], lines
    assert metrics(proxy)[STANDBYS] == 0
    pair.standby.start()
    pair.wait_streaming()
    lines = checked(proxy, 3)
    assert lines[2]["level"] == "info" and "why=periodic" in lines[2]["detail"], lines
    assert metrics(proxy)[STANDBYS] == 1
    # The checks in between found nothing new, and said nothing.
    assert len(durability_lines(proxy)) == 3, durability_lines(proxy)
