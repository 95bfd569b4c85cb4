"""Stored responses sealed at rest (store_encryption): a replay is
byte-identical, a record altered or copied to another scope is never
replayed and nothing is forwarded in its place, keys rotate with
--reencrypt, a key file others may read is refused, store_body =
"status_only" keeps no body."""
import base64
import json
import os
import signal
import subprocess

import psycopg
import pytest
import requests

from conftest import ADMIN_TOKEN, run_binary
from helpers import TIMEOUT, assert_problem, is_replay, new_key, wait_until
from store_support import insert_record, metrics, pay, reaper_pass

K1 = base64.b64encode(bytes(range(32))).decode()
K2 = base64.b64encode(bytes(range(100, 132))).decode()
K3 = base64.b64encode(bytes(range(200, 232))).decode()
SECRET = "Jane Q. Cardholder, 4242"  # personal data in every response body


def write_keys(path, keys, active, mode=0o600):
    """keys: {id: base64}. Written in place, so a proxy's SIGHUP sees it."""
    text = "# test keys\nactive = %s\n" % active
    text += "".join("%s %s\n" % (k, v) for k, v in keys.items())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, mode)
    return path


def sealed_proxy(make_proxy, tmp_path, keys=None, active="k1", **kw):
    path = write_keys(str(tmp_path / "keys"), keys or {"k1": K1}, active)
    top = dict(kw.pop("top", None) or {})
    top["store_encryption"] = {"keys": path}
    return make_proxy(top=top, **kw), path


def personal(stub):
    """Every upstream answer carries personal data."""
    stub.configure({"json": {"holder": SECRET, "last4": "4242"}})


def stored(pg, key):
    rec = pg.record(key)
    return rec, bytes(rec["response_headers"]), bytes(rec["response_body"])


def reload_and_wait(proxy, what):
    n = proxy.log().count(what)
    proxy.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: proxy.log().count(what) > n, what=repr(what))


def unreadable_count(proxy):
    return metrics(proxy).get('idemproxy_events_total{event="record_unreadable"}', 0)


@pytest.mark.no_replay_cache
def test_replay_is_byte_identical_and_nothing_readable_is_stored(make_proxy, stub, pg,
                                                                 tmp_path):
    personal(stub)
    proxy, _ = sealed_proxy(make_proxy, tmp_path)
    key = new_key()
    first = pay(proxy, key)
    assert first.status_code == 201 and SECRET.encode() in first.content
    again = pay(proxy, key)
    assert again.status_code == 201 and is_replay(again)
    assert again.content == first.content
    for h in ("Content-Type", "Location"):
        assert again.headers[h] == first.headers[h]
    assert stub.count(key=key) == 1
    rec, h, b = stored(pg, key)
    assert rec["seal_key"] == "k1"
    assert h[:1] == b"\x00" and b[:1] == b"\x00"
    assert b"4242" not in b and b"Cardholder" not in b
    assert first.headers["Location"].encode() not in h
    # neither the key nor the body reaches the log
    log = proxy.log()
    assert K1 not in log and SECRET not in log and "4242" not in log


@pytest.mark.no_replay_cache
@pytest.mark.parametrize("column", ["response_body", "response_headers"])
def test_a_flipped_byte_is_never_replayed(make_proxy, stub, pg, tmp_path, column):
    personal(stub)
    proxy, _ = sealed_proxy(make_proxy, tmp_path)
    key = new_key()
    assert pay(proxy, key).status_code == 201
    before = unreadable_count(proxy)
    # flip one bit in the middle of the ciphertext
    assert pg.execute("UPDATE idempotency_records SET {c} = set_byte({c}, "
                      "length({c}) / 2, get_byte({c}, length({c}) / 2) # 1) "
                      "WHERE idem_key = %s".format(c=column), (key,)) == 1
    r = pay(proxy, key)
    assert_problem(r, 500, "idempotency_record_unreadable")
    assert SECRET.encode() not in r.content
    assert stub.count(key=key) == 1  # nothing forwarded in its place
    assert unreadable_count(proxy) == before + 1
    line = [json.loads(l) for l in proxy.log().splitlines()
            if "stored record cannot be read" in l]
    assert line and key in line[0]["detail"] and "does not authenticate" in line[0]["detail"]
    assert pg.record(key)["state"] == "completed"  # left for an operator


@pytest.mark.no_replay_cache
def test_a_row_copied_to_another_tenant_does_not_open(make_proxy, stub, pg, tmp_path):
    personal(stub)
    proxy, _ = sealed_proxy(make_proxy, tmp_path)
    key = new_key()
    path = "/hooks/pay"
    acme = pay(proxy, key, path=path, headers={"X-Tenant-Id": "acme"})
    assert acme.status_code == 201
    # the same payload from another tenant has the same fingerprint: a copy
    # of acme's row under globex would be its replay if it opened
    assert pg.execute(
        "INSERT INTO idempotency_records SELECT 'header:globex', operation, idem_key, "
        "request_hash, state, owner_token, attempt, lease_until, hold_on_unknown, "
        "response_status, response_headers, response_body, replayable, created_at, "
        "updated_at, expires_at, seal_key FROM idempotency_records "
        "WHERE tenant = 'header:acme' AND idem_key = %s", (key,)) == 1
    r = pay(proxy, key, path=path, headers={"X-Tenant-Id": "globex"})
    assert_problem(r, 500, "idempotency_record_unreadable")
    assert SECRET.encode() not in r.content
    assert stub.count(key=key) == 1
    # acme's own record still replays
    again = pay(proxy, key, path=path, headers={"X-Tenant-Id": "acme"})
    assert is_replay(again) and again.content == acme.content


@pytest.mark.no_replay_cache
def test_rotation_reencrypt_then_the_old_key_removed(make_proxy, stub, pg, tmp_path):
    personal(stub)
    # two records from before encryption was on, in the clear
    plain = make_proxy()
    clear_keys = [new_key("clear") for _ in range(2)]
    answers = {k: pay(plain, k) for k in clear_keys}
    plain.stop()
    proxy, keys = sealed_proxy(make_proxy, tmp_path)
    k1_keys = [new_key("k1") for _ in range(5)]
    answers.update({k: pay(proxy, k) for k in k1_keys})
    write_keys(keys, {"k1": K1, "k2": K2}, "k2")
    reload_and_wait(proxy, "sealing_key=k2")
    k2_keys = [new_key("k2") for _ in range(2)]
    answers.update({k: pay(proxy, k) for k in k2_keys})
    counts = {r["seal_key"]: r["n"] for r in pg.query(
        "SELECT seal_key, count(*) AS n FROM idempotency_records GROUP BY 1")}
    assert counts == {None: 2, "k1": 5, "k2": 2}
    # the old key still opens its records
    for k in k1_keys + clear_keys:
        assert pay(proxy, k).content == answers[k].content

    # a record locked by live traffic is skipped, not waited for
    locker = psycopg.connect(pg.url)
    locker.execute("SELECT 1 FROM idempotency_records WHERE idem_key = %s FOR UPDATE",
                   (k1_keys[0],))
    try:
        r = run_binary(["-c", proxy.conf_path, "--reencrypt", "--batch", "2"])
    finally:
        locker.rollback()
        locker.close()
    assert r.returncode == 1, r.stdout + r.stderr
    progress = [l for l in r.stdout.splitlines() if l.endswith("so far")]
    assert len(progress) >= 3, r.stdout  # bounded batches, one line each
    assert progress[-1] == "reencrypt: 6 re-sealed, 0 unreadable so far", r.stdout
    assert 'left under key "k1": 1' in r.stdout
    # resumable: a second run takes up what is left
    r = run_binary(["-c", proxy.conf_path, "--reencrypt"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 re-sealed" in r.stdout
    assert 'every completed record is sealed under "k2"' in r.stdout
    assert K1 not in r.stdout + r.stderr and K2 not in r.stdout + r.stderr
    counts = {r["seal_key"]: r["n"] for r in pg.query(
        "SELECT seal_key, count(*) AS n FROM idempotency_records GROUP BY 1")}
    assert counts == {"k2": 9}

    write_keys(keys, {"k2": K2}, "k2")
    reload_and_wait(proxy, "configuration reloaded")
    for k, first in answers.items():
        again = pay(proxy, k)
        assert again.status_code == 201 and is_replay(again), (k, again.content)
        assert again.content == first.content
        assert again.headers["Location"] == first.headers["Location"]
        assert stub.count(key=k) == 1
    assert unreadable_count(proxy) == 0


@pytest.mark.no_replay_cache
def test_a_removed_key_leaves_its_records_unreadable(make_proxy, stub, pg, tmp_path):
    proxy, keys = sealed_proxy(make_proxy, tmp_path)
    key = new_key()
    assert pay(proxy, key).status_code == 201
    write_keys(keys, {"k2": K2}, "k2")  # k1 dropped without --reencrypt
    reload_and_wait(proxy, "sealing_key=k2")
    r = pay(proxy, key)
    assert_problem(r, 500, "idempotency_record_unreadable")
    assert stub.count(key=key) == 1
    assert 'sealed under key \\"k1\\", which the key file does not hold' in proxy.log()


def test_sighup_with_a_bad_key_file_keeps_the_old_keys(make_proxy, stub, pg, tmp_path):
    proxy, keys = sealed_proxy(make_proxy, tmp_path)
    key = new_key()
    first = pay(proxy, key)
    with open(keys, "w") as f:
        f.write("active = k2\nk2 not-base64\n")
    reload_and_wait(proxy, "reload failed")
    assert "not-base64" not in proxy.log()
    os.chmod(keys, 0o644)
    write_keys(keys, {"k2": K2}, "k2", mode=0o644)
    reload_and_wait(proxy, "reload failed")
    assert "accessible by group or others" in proxy.log()
    assert pay(proxy, key).content == first.content
    other = new_key()
    assert pay(proxy, other).status_code == 201
    assert pg.record(other)["seal_key"] == "k1"


@pytest.mark.parametrize("text,mode,why", [
    ("active = k1\nk1 %s\n" % K1, 0o644, "accessible by group or others (mode 0644)"),
    ("active = k1\nk1 %s\n" % K1, 0o640, "accessible by group or others (mode 0640)"),
    ("active = k1\nk1 %s\n" % K1, 0o604, "accessible by group or others"),
    ("active = k1\nk1 %s\n" % K1[:-4], 0o600, ":2: key \"k1\": expected a 256-bit key"),
    ("k1 %s\n" % K1, 0o600, "no \"active = ID\" line"),
    ("active = k9\nk1 %s\n" % K1, 0o600, ":1: active key \"k9\" is not listed"),
])
def test_check_refuses_a_bad_key_file(make_proxy, tmp_path, text, mode, why):
    keys = str(tmp_path / "keys")
    fd = os.open(keys, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, text.encode())
    os.close(fd)
    os.chmod(keys, mode)
    proxy = make_proxy(top={"store_encryption": {"keys": keys}}, migrate=False,
                       start=False)
    r = run_binary(["-c", proxy.conf_path, "--check"])
    assert r.returncode == 1, r.stdout
    assert "store_encryption.keys: " + keys in r.stderr and why in r.stderr, r.stderr
    assert K1 not in r.stderr and K1[:20] not in r.stderr
    # and the proxy itself does not start with it
    r = run_binary(["-c", proxy.conf_path])
    assert r.returncode == 1 and why in r.stderr


def test_check_names_the_active_key(make_proxy, tmp_path):
    keys = write_keys(str(tmp_path / "keys"), {"k1": K1, "k2": K2}, "k2")
    proxy = make_proxy(top={"store_encryption": {"keys": keys}}, migrate=False,
                       start=False)
    r = run_binary(["-c", proxy.conf_path, "--check"])
    assert r.returncode == 0, r.stderr
    assert 'store_encryption: 2 keys in %s, active "k2"' % keys in r.stdout
    assert K1 not in r.stdout and K2 not in r.stdout


@pytest.mark.no_replay_cache
@pytest.mark.parametrize("sealed", [False, True])
def test_status_only_keeps_status_and_headers_not_the_body(make_proxy, stub, pg, tmp_path,
                                                           sealed):
    personal(stub)
    over = {"route_overrides": {"create_payment": {"store_body": "status_only"}}}
    proxy = (sealed_proxy(make_proxy, tmp_path, **over)[0] if sealed
             else make_proxy(**over))
    key = new_key()
    first = pay(proxy, key)
    assert first.status_code == 201 and SECRET.encode() in first.content
    rec, h, b = stored(pg, key)
    assert b == b"" and rec["replayable"] is True
    assert (h[:1] == b"\x00") == sealed
    again = pay(proxy, key)
    assert again.status_code == 201 and is_replay(again)
    assert again.content == b""
    assert again.headers["Location"] == first.headers["Location"]
    assert stub.count(key=key) == 1
    # a body larger than max_stored_response is no reason to refuse a replay
    big = new_key()
    stub.configure({"key": big, "size": 200000})
    proxy_big = make_proxy(top={"max_stored_response": "1KiB"}, **over)
    assert pay(proxy_big, big).status_code == 201
    r = pay(proxy_big, big)
    assert r.status_code == 201 and is_replay(r) and r.content == b""


def test_the_replay_cache_holds_plaintext_with_encryption_on(make_proxy, stub, pg,
                                                            tmp_path):
    personal(stub)
    proxy, _ = sealed_proxy(make_proxy, tmp_path,
                            top={"database": {"url": pg.url, "statement_timeout": "300ms"}})
    key = new_key()
    first = pay(proxy, key)
    hits = metrics(proxy).get('idemproxy_events_total{event="replay_cache_hit"}', 0)
    lock = psycopg.connect(pg.url)
    lock.execute("BEGIN")
    lock.execute("LOCK TABLE idempotency_records IN ACCESS EXCLUSIVE MODE")
    try:
        again = pay(proxy, key)  # the store is unreachable: from memory
    finally:
        lock.rollback()
        lock.close()
    assert again.status_code == 201 and is_replay(again)
    assert again.content == first.content
    assert again.headers["Location"] == first.headers["Location"]
    assert metrics(proxy)['idemproxy_events_total{event="replay_cache_hit"}'] == hits + 1
    # a replay read from the store (another key, cache filled from the
    # claim) is opened once and then served from memory too
    other = new_key()
    o1 = pay(proxy, other)
    assert pay(proxy, other).content == o1.content
    assert stub.count(key=key) == 1 and stub.count(key=other) == 1


def test_admin_get_shows_the_sealed_record_as_stored(make_proxy, stub, pg, tmp_path):
    personal(stub)
    proxy, _ = sealed_proxy(make_proxy, tmp_path)
    key = new_key()
    assert pay(proxy, key).status_code == 201
    r = requests.get("%s/admin/keys/default/create_payment/%s" % (proxy.admin_url, key),
                     headers={"Authorization": "Bearer " + ADMIN_TOKEN}, timeout=TIMEOUT)
    assert r.status_code == 200
    doc = r.json()
    assert doc["sealed_with"] == "k1"
    _, h, b = stored(pg, key)
    assert base64.b64decode(doc["response_headers"]["sealed"]) == h
    assert base64.b64decode(doc["response_body"]) == b
    assert SECRET not in r.text and "4242" not in r.text


def test_reencrypt_ends_past_an_unreadable_record_with_the_longest_key(make_proxy, pg,
                                                                       tmp_path):
    """The cursor holds a whole key (up to 1,024 bytes, from the domain):
    a cut copy sorts before the row it came from, so a batch of one that
    leaves that row as it is would select it again, forever."""
    proxy, keys = sealed_proxy(make_proxy, tmp_path, start=False)
    long_keys = [("%d" % i) * 1024 for i in (1, 2)]
    for k in long_keys:
        insert_record(pg, k, state="completed", lease=None, status=201, body=b"{}")
    # sealed under a key the file does not hold: it never opens
    assert pg.execute("UPDATE idempotency_records SET seal_key = 'gone', "
                      "response_headers = '\\x00'::bytea || response_headers "
                      "WHERE idem_key = %s", (long_keys[0],)) == 1
    write_keys(keys, {"k1": K1, "k2": K2}, "k2")
    try:
        r = run_binary(["-c", proxy.conf_path, "--reencrypt", "--batch", "1"],
                       timeout=20)
    except subprocess.TimeoutExpired as e:
        pytest.fail("--reencrypt --batch 1 did not end: %r" % (e.stdout or b"")[-300:])
    assert r.returncode == 1, r.stdout + r.stderr
    assert "reencrypt: 1 re-sealed, 1 unreadable so far" in r.stdout, r.stdout
    assert r.stderr.count("left as it is") == 1, r.stderr
    assert 'left under key "gone": 1' in r.stdout
    assert pg.record(long_keys[1])["seal_key"] == "k2"


def two_sealed_instances(make_proxy, tmp_path):
    """Two instances on one database, each with its own copy of the key
    file (as on two hosts)."""
    out = []
    for name in ("a", "b"):
        path = write_keys(str(tmp_path / ("keys-" + name)), {"k1": K1}, "k1")
        out.append((make_proxy(top={"store_encryption": {"keys": path}}), path))
    return out


def readable_everywhere(instances, answers):
    for proxy, _ in instances:
        for k, first in answers.items():
            again = pay(proxy, k)
            assert again.status_code == 201 and is_replay(again), (k, again.content)
            assert again.content == first.content


@pytest.mark.no_replay_cache
def test_rotation_in_one_edit_leaves_an_instance_unable_to_read_new_records(
        make_proxy, stub, pg, tmp_path):
    """The hazard the two phases avoid: a key added and made active in one
    edit seals records that an instance not yet reloaded cannot open."""
    personal(stub)
    (a, keys_a), (b, keys_b) = two_sealed_instances(make_proxy, tmp_path)
    write_keys(keys_a, {"k1": K1, "k2": K2}, "k2")
    reload_and_wait(a, "sealing_key=k2")
    assert "added in this same reload" in a.log()
    key = new_key()
    assert pay(a, key).status_code == 201
    assert pg.record(key)["seal_key"] == "k2"
    r = pay(b, key)  # b has not been reloaded yet
    assert_problem(r, 500, "idempotency_record_unreadable")
    assert stub.count(key=key) == 1
    assert 'sealed under key \\"k2\\", which the key file does not hold' in b.log()
    # once b has the key, the record opens there too
    write_keys(keys_b, {"k1": K1, "k2": K2}, "k2")
    reload_and_wait(b, "sealing_key=k2")
    assert is_replay(pay(b, key))


@pytest.mark.no_replay_cache
def test_rotation_in_two_phases_keeps_every_record_readable_on_every_instance(
        make_proxy, stub, pg, tmp_path):
    personal(stub)
    inst = two_sealed_instances(make_proxy, tmp_path)
    (a, keys_a), (b, keys_b) = inst
    answers = {}
    for p, _ in inst:
        k = new_key("k1")
        answers[k] = pay(p, k)
    # phase 1: add k2 everywhere, k1 stays active; reload every instance
    for p, path in inst:
        write_keys(path, {"k1": K1, "k2": K2}, "k1")
        reload_and_wait(p, "configuration reloaded")
        k = new_key("phase1")
        answers[k] = pay(p, k)
        readable_everywhere(inst, answers)
    # phase 2: make k2 active, one instance at a time; records either one
    # seals in between open on the other
    for p, path in inst:
        write_keys(path, {"k1": K1, "k2": K2}, "k2")
        reload_and_wait(p, "sealing_key=k2")
        for q, _ in inst:
            k = new_key("phase2")
            answers[k] = pay(q, k)
        readable_everywhere(inst, answers)
    sealed = {r["seal_key"] for r in pg.query(
        "SELECT seal_key FROM idempotency_records WHERE idem_key = ANY(%s)",
        (list(answers),))}
    assert sealed == {"k1", "k2"}
    for p, _ in inst:
        assert unreadable_count(p) == 0
        assert "added in this same reload" not in p.log()
    for k in answers:
        assert stub.count(key=k) == 1


def seal_counts(proxy):
    m = metrics(proxy)
    return ({k: v for k, v in m.items() if k.startswith("idemproxy_seal_key_seals{")},
            m.get("idemproxy_seal_active_key_seals"), m.get("idemproxy_seal_warn_seals"))


WARNING = "sealing key nears its nonce budget"


def test_seals_per_key_are_counted_and_warned_of_before_the_budget(make_proxy, stub, pg,
                                                                   tmp_path):
    # Random 96-bit nonces are safe for about 2^32 seals per key: every
    # seal is counted per key id in the store, exported, and a warning
    # (log and gauges an alert compares) comes at warn_seals.
    personal(stub)
    path = write_keys(str(tmp_path / "keys"), {"k1": K1}, "k1")
    top = {"store_encryption": {"keys": path, "warn_seals": 5},
           "reaper": {"interval": "100ms"}}
    proxy = make_proxy(top=top)
    for _ in range(2):  # headers and body: two seals a record
        assert pay(proxy, new_key()).status_code == 201
    wait_until(lambda: seal_counts(proxy)[0].get('idemproxy_seal_key_seals{key="k1"}') == 4,
               what="4 seals counted (now %r)" % (seal_counts(proxy),))
    per_key, active, warn_at = seal_counts(proxy)
    assert (active, warn_at) == (4, 5)
    assert WARNING not in proxy.log()
    assert pg.query("SELECT seals FROM idemproxy_seal_counts "
                    "WHERE seal_key = 'k1'")[0]["seals"] == 4
    key = new_key()
    assert pay(proxy, key).status_code == 201
    wait_until(lambda: WARNING in proxy.log(), what="the budget warning")
    per_key, active, warn_at = seal_counts(proxy)
    assert per_key == {'idemproxy_seal_key_seals{key="k1"}': 6}
    assert active >= warn_at == 5
    assert 'key=k1 seals=6 warn_seals=5' in proxy.log()
    # A replay opens, and seals nothing.
    assert is_replay(pay(proxy, key))
    reaper_pass(pg)
    assert pg.query("SELECT seals FROM idemproxy_seal_counts")[0]["seals"] == 6
    # The count lives in the store: another instance sees it at once.
    other = make_proxy(top=top)
    wait_until(lambda: seal_counts(other)[1] == 6, what="the other instance's count")
    assert WARNING in other.log()


def stored_seals(pg):
    return {r["seal_key"]: r["seals"] for r in
            pg.query("SELECT seal_key, seals FROM idemproxy_seal_counts")}


def test_reencrypt_and_a_stopping_proxy_count_their_seals(make_proxy, stub, pg, tmp_path):
    personal(stub)
    proxy, keys = sealed_proxy(make_proxy, tmp_path)
    for _ in range(3):
        assert pay(proxy, new_key()).status_code == 201
    assert proxy.stop() == 0  # its last reaper pass writes the tally
    assert stored_seals(pg) == {"k1": 6}
    write_keys(keys, {"k1": K1, "k2": K2}, "k2")
    r = run_binary(["-c", proxy.conf_path, "--reencrypt", "--batch", "2"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert stored_seals(pg) == {"k1": 6, "k2": 6}
