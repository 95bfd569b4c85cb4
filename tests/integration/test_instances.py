"""Several instances sharing one database (SPEC 4: "correctness must not
depend on there being one"). The claim is the only coordination between
them, so concurrent attempts of one key through different instances must
still reach the upstream once."""
from collections import Counter, defaultdict

import requests

from helpers import (TIMEOUT, assert_problem, assert_retry_after, fire_together, is_replay,
                     new_key)

PAY = "/v1/payments"
KEYS = 20
PER_KEY = 10  # requests per key, half through each instance


def test_two_instances_on_one_database_forward_each_key_once(make_proxy, stub, pg):
    a = make_proxy(top={"workers": 8})
    b = make_proxy(top={"workers": 8})
    keys = [new_key("multi%02d" % i) for i in range(KEYS)]
    bodies = [{"amount": 1000 + i, "currency": "EUR"} for i in range(KEYS)]
    # A slow upstream (0.5 to 1 s) keeps each first attempt in flight while
    # the other requests for its key arrive through both instances.
    stub.configure(*[{"prefix": PAY, "key": k, "delay": 0.5 + (i % 6) * 0.1}
                     for i, k in enumerate(keys)])

    def send(j):
        i = j % KEYS
        p = (a, b)[(j // KEYS) % 2]
        return p.url, i, requests.post(p.url + PAY, json=bodies[i],
                                       headers={"Idempotency-Key": keys[i]}, timeout=60)

    results = fire_together(KEYS * PER_KEY, send)
    errors = [r for r in results if isinstance(r, Exception)]
    assert not errors, errors[:3]
    assert {url for url, _, _ in results} == {a.url, b.url}

    by_key = defaultdict(list)
    for _, i, r in results:
        by_key[i].append(r)
    problems = []
    originals = {}
    for i, responses in sorted(by_key.items()):
        firsts = [r for r in responses if r.status_code == 201 and not is_replay(r)]
        if len(firsts) != 1:
            problems.append("key %d: %d original responses" % (i, len(firsts)))
            continue
        originals[i] = firsts[0]
        for r in responses:
            if r is firsts[0]:
                continue
            if r.status_code == 201 and is_replay(r):
                if r.content != firsts[0].content:
                    problems.append("key %d: replay %r differs from %r" % (
                        i, r.content, firsts[0].content))
                continue
            try:
                assert_problem(r, 409, "idempotency_key_in_use")
                assert_retry_after(r)
            except AssertionError as e:
                problems.append("key %d: %s" % (i, e))
    assert not problems, "\n".join(problems[:20])

    # The upstream saw each key exactly once, whichever instance sent it.
    assert Counter(s.key for s in stub.requests()) == Counter({k: 1 for k in keys})
    recs = {r["idem_key"]: r for r in pg.records()}
    assert set(recs) == set(keys)
    for i, k in enumerate(keys):
        assert recs[k]["state"] == "completed" and recs[k]["attempt"] == 1, recs[k]
        assert bytes(recs[k]["response_body"]) == originals[i].content

    # Afterwards both instances replay every key.
    for i, k in enumerate(keys):
        for p in (a, b):
            r = p.post(PAY, key=k, json=bodies[i])
            assert r.status_code == 201 and is_replay(r), (p.url, r.status_code, r.content)
            assert r.content == originals[i].content
    assert stub.count() == KEYS
