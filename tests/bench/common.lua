-- Shared by the benchmark's wrk scripts: thread ids, arguments, and one
-- machine-readable result line.
--
-- A script is run as `wrk ... -s SCRIPT -- TAG [PATH]`. TAG makes the keys
-- of one run unique across runs against the same database; each wrk thread
-- gets a number in setup(), so TAG-THREAD-COUNTER is unique across threads
-- and connections (a thread's connections share its counter).

bench = {
	path = "/v1/payments",
	body = '{"amount": 1000, "currency": "eur", "description": "bench"}',
	tag = "run",
}

local threads = 0

function setup(thread)
	threads = threads + 1
	thread:set("tid", threads)
end

function bench.args(args)
	bench.tag = args[1] or bench.tag
	bench.path = args[2] or bench.path
end

function bench.post(key, body)
	return wrk.format("POST", bench.path, {
		["Content-Type"] = "application/json",
		["Idempotency-Key"] = key,
	}, body or bench.body)
end

-- The line the harness reads; latency and duration are in microseconds.
-- status counts answers >= 400 (wrk counts nothing else as an error).
function done(summary, latency, requests)
	local e = summary.errors
	io.write(string.format(
		"BENCH requests=%d duration_us=%d p50_us=%d p99_us=%d " ..
		"mean_us=%.1f max_us=%d status=%d connect=%d read=%d " ..
		"write=%d timeout=%d\n",
		summary.requests, summary.duration, latency:percentile(50),
		latency:percentile(99), latency.mean, latency.max, e.status,
		e.connect, e.read, e.write, e.timeout))
end
