-- cellvisor cell runtime: resolving origin names.
--
-- A stub resolver over UDP (the cells' lua-resty-core has no DNS client):
-- it asks the configured servers (the host's /etc/resolv.conf unless
-- openresty.resolvers says otherwise) for a name's A records, then AAAA,
-- and keeps the answer in the worker for its TTL, bounded to 5–300 s; a
-- name that does not resolve is remembered as such for 5 s. Only the
-- content phase may call resolve (it uses a cosocket).
local bit = require "bit"

local _M = {}

local servers = {}      -- { {host, port}, ... }
local cache = {}        -- name -> { addrs = {...}, next = i, expires = t } or { err = why, expires = t }
local cached = 0
local MAX_CACHED = 10000
local MIN_TTL, MAX_TTL, NEGATIVE_TTL = 5, 300, 5
-- Each server gets a second, and a name's lookup at most MAX_ASKED of
-- them: a resolver that hangs holds a request a few seconds, not minutes.
local TIMEOUT_MS, MAX_ASKED = 1000, 3

-- The query ids come from math.random: seeded per worker from the
-- kernel (LuaJIT's is the same in every process unless seeded), so an
-- answer cannot be forged by guessing the next id.
function _M.init_worker()
    local f = io.open("/dev/urandom", "rb")
    local b = f and f:read(4)
    if f then f:close() end
    local seed = ngx.now() * 1000 + ngx.worker.pid()
    if b and #b == 4 then
        seed = ((string.byte(b, 1) * 256 + string.byte(b, 2)) * 256 + string.byte(b, 3)) * 256 + string.byte(b, 4)
    end
    math.randomseed(seed)
end

-- init takes the servers, each "address" or "address:port" ("[v6]:port").
function _M.init(list)
    servers = {}
    for _, s in ipairs(list or {}) do
        local host, port = string.match(s, "^%[(.+)%]:(%d+)$")
        if not host then host, port = string.match(s, "^([^:]+):(%d+)$") end
        if not host then host, port = s, "53" end
        servers[#servers + 1] = { host, tonumber(port) }
    end
    cache, cached = {}, 0
end

local function query(name, qtype, id)
    local parts = { string.char(bit.rshift(id, 8), bit.band(id, 0xff), 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0) }
    for label in string.gmatch(name, "[^.]+") do
        parts[#parts + 1] = string.char(#label) .. label
    end
    parts[#parts + 1] = string.char(0, 0, qtype, 0, 1)
    return table.concat(parts)
end

-- skip_name returns the offset after the (possibly compressed) name at i.
local function skip_name(msg, i)
    while true do
        local len = string.byte(msg, i)
        if not len then return nil end
        if len == 0 then return i + 1 end
        if bit.band(len, 0xc0) == 0xc0 then return i + 2 end
        i = i + 1 + len
    end
end

local function u16(msg, i)
    local a, b = string.byte(msg, i, i + 1)
    if not b then return nil end
    return a * 256 + b
end

-- parse reads the addresses of type qtype and their smallest TTL from an
-- answer to query id, or nil and why.
local function parse(msg, id, qtype)
    if #msg < 12 or u16(msg, 1) ~= id then return nil, "malformed answer" end
    local flags = u16(msg, 3)
    local rcode = bit.band(flags, 0x0f)
    if rcode == 3 then return nil, "no such name (NXDOMAIN)" end
    if rcode ~= 0 then return nil, "the server answered rcode " .. rcode end
    local qd, an = u16(msg, 5), u16(msg, 7)
    local i = 13
    for _ = 1, qd do
        i = skip_name(msg, i)
        if not i then return nil, "malformed answer" end
        i = i + 4
    end
    local addrs, ttl = {}, nil
    for _ = 1, an do
        i = skip_name(msg, i)
        if not i or i + 10 > #msg + 1 then return nil, "malformed answer" end
        local rtype, rttl = u16(msg, i), u16(msg, i + 4) * 65536 + u16(msg, i + 6)
        local rdlen = u16(msg, i + 8)
        local rdata = string.sub(msg, i + 10, i + 9 + rdlen)
        i = i + 10 + rdlen
        if #rdata ~= rdlen then return nil, "malformed answer" end
        if rtype == qtype and qtype == 1 and rdlen == 4 then
            addrs[#addrs + 1] = string.format("%d.%d.%d.%d", string.byte(rdata, 1, 4))
            ttl = math.min(ttl or rttl, rttl)
        elseif rtype == qtype and qtype == 28 and rdlen == 16 then
            local w = {}
            for k = 1, 16, 2 do w[#w + 1] = string.format("%x", u16(rdata, k)) end
            addrs[#addrs + 1] = table.concat(w, ":")
            ttl = math.min(ttl or rttl, rttl)
        end
    end
    if #addrs == 0 then return nil, "no address" end
    return addrs, ttl
end

local function ask(name, qtype)
    local last = "no resolver configured"
    for n, srv in ipairs(servers) do
        if n > MAX_ASKED then break end
        local sock = ngx.socket.udp()
        sock:settimeout(TIMEOUT_MS)
        local ok, err = sock:setpeername(srv[1], srv[2])
        if ok then
            local id = math.random(0, 65535)
            ok, err = sock:send(query(name, qtype, id))
            if ok then
                local msg
                msg, err = sock:receive()
                if msg then
                    local addrs, ttl = parse(msg, id, qtype)
                    sock:close()
                    return addrs, ttl -- an answer (even NXDOMAIN) ends the search
                end
            end
        end
        sock:close()
        last = srv[1] .. ": " .. tostring(err)
    end
    return nil, last
end

local function remember(name, entry)
    if not cache[name] then
        if cached >= MAX_CACHED then cache, cached = {}, 0 end
        cached = cached + 1
    end
    cache[name] = entry
end

-- resolve answers an address of name (rotating through its records) or
-- nil and why.
function _M.resolve(name)
    local now = ngx.now()
    local e = cache[name]
    if not e or e.expires <= now then
        local addrs, ttl_or_err = ask(name, 1)
        -- AAAA only where A has none (not where the servers failed).
        if not addrs and ttl_or_err == "no address" then
            local v6, ttl6 = ask(name, 28)
            if v6 then addrs, ttl_or_err = v6, ttl6 end
        end
        if addrs then
            e = { addrs = addrs, next = 1, expires = now + math.max(MIN_TTL, math.min(MAX_TTL, ttl_or_err)) }
        else
            e = { err = ttl_or_err or "no address", expires = now + NEGATIVE_TTL }
        end
        remember(name, e)
    end
    if e.err then return nil, e.err end
    local a = e.addrs[e.next]
    e.next = e.next % #e.addrs + 1
    return a
end

return _M
