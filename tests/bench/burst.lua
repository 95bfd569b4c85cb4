-- Bursts of duplicates: each key is sent 5 times in a row, as a client that
-- retries would. Run with one connection per thread (-t = -c) so "in a row"
-- holds per connection: the first is forwarded, the next four replayed.
dofile(debug.getinfo(1, "S").source:match("^@(.*/)") .. "common.lua")

local burst = 5
local n = 0

function init(args)
	bench.args(args)
end

function request()
	local key = bench.tag .. "-" .. tid .. "-" .. math.floor(n / burst)
	n = n + 1
	return bench.post(key)
end
