-- First attempts only: every request carries a key never sent before.
dofile(debug.getinfo(1, "S").source:match("^@(.*/)") .. "common.lua")

local n = 0

function init(args)
	bench.args(args)
end

function request()
	n = n + 1
	return bench.post(bench.fresh_key(n), nil, n)
end
