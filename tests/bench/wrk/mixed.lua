-- A mixed load for the memory check, in cycles of 25 requests per thread:
-- 1 first attempt, 1 request without a key (400), 1 reuse of the hot key
-- with another payload (409 mismatch), 1 GET, which passes through
-- unprotected, and 21 replays of a key completed before the run (TAG-hot).
-- Every path a well-formed request takes, so a leak on any of them shows;
-- first attempts are few because each costs two commits, and the check
-- needs 200,000 requests in well under a minute.
dofile(debug.getinfo(1, "S").source:match("^@(.*/)") .. "common.lua")

local n = 0
local other = '{"amount": 2000, "currency": "eur", "description": "bench"}'

function init(args)
	bench.args(args)
end

function request()
	n = n + 1
	local step = n % 25
	if step == 0 then
		return bench.post(bench.fresh_key(n))
	elseif step == 1 then
		return wrk.format("POST", bench.path,
			{ ["Content-Type"] = "application/json" }, bench.body)
	elseif step == 2 then
		return bench.post(bench.tag .. "-hot", other)
	elseif step == 3 then
		return wrk.format("GET", bench.path)
	end
	return bench.post(bench.tag .. "-hot")
end
