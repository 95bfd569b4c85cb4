"""The test harness itself, where a race in it would fail other tests at
random."""
import threading

import psycopg
import pytest

from conftest import start_stub, stop_stub
from helpers import TIMEOUT, free_port, wait_until
from pg_relay import PgRelay


def test_free_port_is_never_one_a_starting_stub_may_still_take(tmp_path):
    # A stub starts with port 0 and reports its port later (it starts while
    # the other fixtures are set up). A port free_port hands out meanwhile
    # is free only until the stub binds: the kernel may give the stub that
    # very port, and the proxy meant to listen there then cannot (seen:
    # "cannot listen on 127.0.0.1:36003 (in use?)", and the test's request
    # answered by the stub). So free_port waits for the stub's own bind.
    s = start_stub(tmp_path)
    try:
        port = free_port()
        assert not callable(s._port), \
            "free_port handed out a port before the starting stub had bound its own"
        assert port != s.port
    finally:
        stop_stub(s)


# --- pg_relay: holds of one statement's answer or of the statement itself ---

def relayed(relay, pg):
    conn = psycopg.connect(relay.url(pg.name), autocommit=True)
    # psycopg names its prepared statements _pg3_0, _pg3_1, ... per connection.
    conn.prepare_threshold = 0
    return conn


def test_relay_holds_an_answer_after_the_statement_ran(pg):
    relay = PgRelay(pg.cluster.port)
    try:
        pg.execute("CREATE TABLE relay_t (n int)")
        with relayed(relay, pg) as c:
            c.execute("SELECT 1")  # _pg3_0, prepared and run
            relay.hold("_pg3_1", seconds=None)
            out = []
            t = threading.Thread(target=lambda: out.append(
                c.execute("INSERT INTO relay_t VALUES (1) RETURNING n").fetchone()))
            t.start()
            wait_until(lambda: relay.held == 1, what="the hold in place")
            wait_until(lambda: pg.query("SELECT count(*) AS n FROM relay_t")[0]["n"] == 1,
                       what="the held statement committed")
            t.join(0.3)
            assert not out, "the held answer was delivered"
            relay.release()
            t.join(TIMEOUT)
            assert out == [(1,)]
            # One shot: the next execution passes.
            assert c.execute("INSERT INTO relay_t VALUES (2) RETURNING n").fetchone() == (2,)
            assert relay.held == 1 and relay.cuts == 0
    finally:
        relay.stop()


def test_relay_holds_a_statement_before_the_server_sees_it_then_cuts(pg):
    relay = PgRelay(pg.cluster.port)
    try:
        pg.execute("CREATE TABLE relay_t (n int)")
        with relayed(relay, pg) as c:
            c.execute("SELECT 1")
            relay.hold("_pg3_1", seconds=None, phase="statement", then="cut")
            errors = []

            def run():
                try:
                    c.execute("INSERT INTO relay_t VALUES (1)")
                except psycopg.OperationalError as e:
                    errors.append(e)
            t = threading.Thread(target=run)
            t.start()
            wait_until(lambda: relay.held == 1, what="the hold in place")
            t.join(0.3)
            assert pg.query("SELECT count(*) AS n FROM relay_t")[0]["n"] == 0
            relay.release()
            t.join(TIMEOUT)
            assert errors and relay.cuts == 1
        assert pg.query("SELECT count(*) AS n FROM relay_t")[0]["n"] == 0
    finally:
        relay.stop()


def test_relay_cuts_a_held_answer_after_its_seconds_and_spares_other_connections(pg):
    relay = PgRelay(pg.cluster.port)
    try:
        pg.execute("CREATE TABLE relay_t (n int)")
        with relayed(relay, pg) as c, relayed(relay, pg) as other:
            c.execute("SELECT 1")
            relay.hold("_pg3_1", seconds=0.5, then="cut")
            with pytest.raises(psycopg.OperationalError):
                c.execute("INSERT INTO relay_t VALUES (1)")
            assert relay.held == 1 and relay.cuts == 1
            assert pg.query("SELECT count(*) AS n FROM relay_t")[0]["n"] == 1
            assert other.execute("SELECT 7").fetchone() == (7,)
            relay.terminate_all()
            with pytest.raises(psycopg.OperationalError):
                other.execute("SELECT 8")
    finally:
        relay.stop()
