-- A mixed load for the memory check, in cycles of ten requests per thread:
-- 3 first attempts, 5 replays of a key completed before the run (TAG-hot),
-- 1 request without a key (400) and 1 reuse of the hot key with another
-- payload (409 mismatch). Every path the proxy takes for a well-formed
-- request, so a leak on any of them shows.
dofile(debug.getinfo(1, "S").source:match("^@(.*/)") .. "common.lua")

local n = 0
local other = '{"amount": 2000, "currency": "eur", "description": "bench"}'

function init(args)
	bench.args(args)
end

function request()
	n = n + 1
	local step = n % 10
	if step < 3 then
		return bench.post(bench.tag .. "-" .. tid .. "-" .. n)
	elseif step < 8 then
		return bench.post(bench.tag .. "-hot")
	elseif step == 8 then
		return wrk.format("POST", bench.path,
			{ ["Content-Type"] = "application/json" }, bench.body)
	end
	return bench.post(bench.tag .. "-hot", other)
end
