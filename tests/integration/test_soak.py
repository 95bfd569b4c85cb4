"""A soak of 10,000 mixed requests: first attempts, replays, mismatches,
rejections and pass-throughs, from several threads. Under `make check-asan`
LeakSanitizer checks the proxy at exit (any leak fails the run); here every
answer and the upstream's count are checked, and the proxy must stop
cleanly."""
from concurrent.futures import ThreadPoolExecutor

import requests

from helpers import TIMEOUT, new_key

PAY = "/v1/payments"
ROUNDS = 1000  # x 10 requests


def one_round(base, i):
    s = requests.Session()
    key = new_key("soak")
    body = {"amount": i, "currency": "EUR"}
    h = {"Idempotency-Key": key}
    got = [s.post(base + PAY, json=body, headers=h, timeout=TIMEOUT).status_code]
    for _ in range(4):  # replays
        r = s.post(base + PAY, json=body, headers=h, timeout=TIMEOUT)
        got.append((r.status_code, r.headers.get("Idempotent-Replayed")))
    got.append(s.post(base + PAY, json={"amount": -1}, headers=h,
                      timeout=TIMEOUT).status_code)                    # mismatch
    got.append(s.post(base + PAY, json=body, timeout=TIMEOUT).status_code)  # no key
    got.append(s.post(base + PAY, json=body, headers={"Idempotency-Key": ""},
                      timeout=TIMEOUT).status_code)                    # invalid key
    got.append(s.get(base + PAY + "?i=%d" % i, timeout=TIMEOUT).status_code)  # pass
    got.append(s.post(base + "/nowhere", timeout=TIMEOUT).status_code)  # no route
    s.close()
    return key, got


def test_soak_of_mixed_requests(make_proxy, stub):
    proxy = make_proxy(top={"workers": 4})
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: one_round(proxy.url, i), range(ROUNDS)))
    # the stub answers 201 to anything, the GET pass-through included
    want = [201] + [(201, "true")] * 4 + [409, 400, 400, 201, 404]
    wrong = [(k, g) for k, g in results if g != want]
    assert not wrong, "%d rounds differ, e.g. %r" % (len(wrong), wrong[0][1][5:])
    # each key reached the upstream exactly once, plus one GET per round
    seen = stub.requests()
    posts = [r for r in seen if r.method == "POST"]
    assert len(posts) == ROUNDS
    assert len({r.key for r in posts}) == ROUNDS
    assert sum(1 for r in seen if r.method == "GET") == ROUNDS
    assert proxy.stop() == 0
