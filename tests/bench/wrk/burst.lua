-- Bursts of duplicates: each key is sent 5 times in a row, as a client that
-- retries would. Run with one connection per thread (-t = -c) so "in a row"
-- holds per connection: the first is forwarded, the next four replayed.
dofile(debug.getinfo(1, "S").source:match("^@(.*/)") .. "common.lua")

local burst = 5
local n = 0
local key

function init(args)
	bench.args(args)
end

function request()
	if n % burst == 0 then
		key = bench.fresh_key(n / burst)
	end
	n = n + 1
	return bench.post(key)
end
