#!/usr/bin/python3
"""A keep-alive client for bench-profile and bench-syscalls: sends N
requests, one at a time on each of CONNS connections (default 1), and
checks that each was what it should be.

  client.py PORT forward|replay N TAG [CONNS]

forward sends keys TAG-0 .. TAG-(N-1) (TAG-C-I with several connections),
each for the first time, and wants a forwarded 201; replay sends the same
requests again and wants each replayed (Idempotent-Replayed: true). Exits 1
on the first surprise."""
import http.client
import sys
import threading

BODY = b'{"amount": 1000, "currency": "eur", "description": "bench"}'


def run(port, mode, keys, errors):
    try:
        send(port, mode, keys, errors)
    except (OSError, http.client.HTTPException) as e:
        errors.append("client: %s: %s" % (mode, e))


def send(port, mode, keys, errors):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for key in keys:
        conn.request("POST", "/v1/payments", body=BODY, headers={
            "Content-Type": "application/json", "Idempotency-Key": key})
        resp = conn.getresponse()
        resp.read()
        replayed = resp.getheader("Idempotent-Replayed") == "true"
        if resp.status != 201 or replayed != (mode == "replay"):
            errors.append("client: %s of %s: status %d, replayed %s"
                          % (mode, key, resp.status, replayed))
            return
    conn.close()


def main():
    port, mode, n, tag = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), \
        sys.argv[4]
    conns = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    errors = []
    if conns == 1:
        run(port, mode, ["%s-%d" % (tag, i) for i in range(n)], errors)
    else:
        threads = [threading.Thread(target=run, args=(
            port, mode, ["%s-%d-%d" % (tag, c, i)
                         for i in range(c, n, conns)], errors))
            for c in range(conns)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        sys.exit(errors[0])


if __name__ == "__main__":
    main()
