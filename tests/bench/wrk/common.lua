-- Shared by the benchmark's wrk scripts: thread ids, arguments, and one
-- machine-readable result line.
--
-- A script is run as `wrk ... -s SCRIPT -- TAG [PATH]`. TAG makes the keys
-- of one run unique across runs against the same database; each wrk thread
-- gets a number in setup(), so TAG-THREAD-COUNTER is unique across threads
-- and connections (a thread's connections share its counter). A fresh key
-- starts with 16 random hex digits: clients send random keys (UUIDs), and
-- where a key lands in the primary key's index is part of what a first
-- attempt costs the store (pgbench's keys are random too).

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
	math.randomseed(os.time() * 1000 + (tid or 0))
end

-- A key never sent before: random prefix, unique suffix.
function bench.fresh_key(n)
	return string.format("%08x%08x-%s-%d-%d", math.random(0, 0x7fffffff),
		math.random(0, 0x7fffffff), bench.tag, tid, n)
end

-- BENCH_TENANTS=N (citus.sh): each key belongs to one of N tenants, sent
-- as X-Tenant-Id (a route with tenant = "header:X-Tenant-Id"), so that
-- the keys spread over the shards of a distributed store.
bench.tenants = tonumber(os.getenv("BENCH_TENANTS") or "")

function bench.post(key, body, n)
	local h = {
		["Content-Type"] = "application/json",
		["Idempotency-Key"] = key,
	}
	if bench.tenants then
		h["X-Tenant-Id"] = tostring((n or 0) % bench.tenants)
	end
	return wrk.format("POST", bench.path, h, body or bench.body)
end

-- The line the harness reads; latency and duration are in microseconds.
-- status counts answers >= 400 (wrk counts nothing else as an error).
-- With BENCH_HIST set, the latency histogram ("microseconds count" lines)
-- is appended to that file too, so that runs cut into slices can be merged
-- into exact percentiles.
function done(summary, latency, requests)
	local path = os.getenv("BENCH_HIST")
	if path and path ~= "" then
		local f = assert(io.open(path, "a"))
		for i = 1, #latency do
			local v, n = latency(i)
			f:write(string.format("%d %d\n", v, n))
		end
		f:close()
	end
	local e = summary.errors
	io.write(string.format(
		"BENCH requests=%d duration_us=%d p50_us=%d p99_us=%d " ..
		"mean_us=%.1f max_us=%d status=%d connect=%d read=%d " ..
		"write=%d timeout=%d\n",
		summary.requests, summary.duration, latency:percentile(50),
		latency:percentile(99), latency.mean, latency.max, e.status,
		e.connect, e.read, e.write, e.timeout))
end
