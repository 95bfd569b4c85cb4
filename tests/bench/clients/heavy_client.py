"""The heavy path for the bench's heavy-replay row: one client that keeps
sending a retry of one key with a ~900 KB JSON body of small objects (its
canonical form, made for the fingerprint of every request, is the most CPU
one request can cost), on one keep-alive connection, until SIGTERM. The
first request completes the key (one upstream request, before the slice
starts); every later one is a replay and reaches no upstream.

usage: heavy_client.py URL KEY READY_FILE STATS_FILE
Writes READY_FILE once the key is completed, and "REQUESTS ERRORS" into
STATS_FILE at exit."""
import http.client
import signal
import sys
import urllib.parse

url, key, ready, stats = sys.argv[1:5]
u = urllib.parse.urlsplit(url)
items = ",".join('{"k%d": %d, "v": [%d, "x"]}' % (i % 997, i, i) for i in range(29000))
body = ('{"amount": 100, "items": [%s]}' % items).encode()
headers = {"Content-Type": "application/json", "Idempotency-Key": key}
stop = False


def on_term(*_):
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_term)
conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
requests = errors = 0
while not stop:
    try:
        conn.request("POST", "/v1/payments", body=body, headers=headers)
        r = conn.getresponse()
        r.read()
        ok = r.status == 201 and (requests == 0 or r.getheader("Idempotent-Replayed") == "true")
    except (OSError, http.client.HTTPException):
        ok = False
        conn.close()
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    if requests == 0:
        if not ok:
            sys.exit("heavy_client: the first request failed")
        open(ready, "w").close()
    requests += 1
    errors += 0 if ok else 1
with open(stats, "w") as f:
    f.write("%d %d\n" % (requests - 1, errors))
