"""Concurrent attempts (SPEC 3.2, 4): one key never runs upstream twice at
once, and distinct keys do not interfere. Each client is its own thread
with its own connection."""
import requests

from helpers import assert_problem, assert_retry_after, fire_together, is_replay, new_key

PAY = "/v1/payments"
N = 50


def post(url, key, body):
    return requests.post(url, json=body, headers={"Idempotency-Key": key}, timeout=30)


def test_same_key_concurrently_reaches_the_upstream_once(proxy, stub, pg):
    key = new_key()
    stub.configure({"prefix": PAY, "delay": 1.0})
    body = {"amount": 4200, "currency": "EUR"}
    results = fire_together(N, lambda i: post(proxy.url + PAY, key, body))

    errors = [r for r in results if isinstance(r, Exception)]
    assert not errors, errors[:3]
    originals = [r for r in results if r.status_code == 201 and not is_replay(r)]
    replays = [r for r in results if r.status_code == 201 and is_replay(r)]
    in_use = [r for r in results if r.status_code == 409]
    others = [r for r in results if r not in originals + replays + in_use]
    assert not others, [(r.status_code, r.content[:200]) for r in others]
    assert len(originals) == 1
    for r in in_use:
        assert_problem(r, 409, "idempotency_key_in_use")
        assert_retry_after(r)
    for r in replays:
        assert r.content == originals[0].content

    seen = stub.requests(key=key)
    assert len(seen) == 1, seen
    rec = pg.record(key)
    assert rec["state"] == "completed"
    assert rec["attempt"] == 1
    assert bytes(rec["response_body"]) == originals[0].content

    # and afterwards everyone gets the replay
    r = post(proxy.url + PAY, key, body)
    assert is_replay(r) and r.content == originals[0].content
    assert stub.count(key=key) == 1


def test_distinct_keys_concurrently_each_reach_the_upstream_once(proxy, stub, pg):
    keys = [new_key("c%02d" % i) for i in range(N)]
    stub.configure({"prefix": PAY, "delay": 0.2})
    results = fire_together(N, lambda i: post(proxy.url + PAY, keys[i], {"i": i}))

    errors = [r for r in results if isinstance(r, Exception)]
    assert not errors, errors[:3]
    bad = [(keys[i], r.status_code, r.content[:200]) for i, r in enumerate(results)
           if r.status_code != 201 or is_replay(r)]
    assert not bad, bad

    per_key = {}
    for s in stub.requests():
        per_key[s.key] = per_key.get(s.key, 0) + 1
    assert per_key == {k: 1 for k in keys}
    ids = {r.json()["id"] for r in results}
    assert len(ids) == N

    recs = pg.records()
    assert len(recs) == N
    assert all(r["state"] == "completed" and r["attempt"] == 1 for r in recs)
    by_key = {r["idem_key"]: bytes(r["response_body"]) for r in recs}
    for i, r in enumerate(results):
        assert by_key[keys[i]] == r.content
