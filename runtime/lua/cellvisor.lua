-- cellvisor cell runtime.
--
-- Public side: routes requests by Host to the pool's domains, answers the
-- readiness probe (503 while drained), counts requests and records
-- passive-origin failures.
-- Private side (unix socket only): GET /status, POST /drain, POST /undrain,
-- POST /load/<release> (serve that release's data without a reload),
-- GET /frontdoor?url=U (the org's front door for U, or the refusal), each
-- authenticated with the cell's secret (see auth below).
--
-- What the cell serves is data (state below): a release's domains, read
-- from its directory. init() reads the release the configuration names,
-- in the master, at every start and reload; a load reads a newer release
-- of the same shape (the same nginx.conf and Lua but for its data) and
-- swaps it in one step, with no new worker; a worker the master starts
-- again (after a crash) finds the release last loaded at init_worker.
-- The shared dict (drained flag, counters, nonces, the loaded release)
-- survives reloads.
local cjson = require "cjson.safe"
local bit = require "bit"
local cvfile = require "cvfile"
local cvdns = require "cvdns"
local balancer = require "ngx.balancer"
local ssl = require "ngx.ssl"
require "frontdoor" -- loaded now: a later require would read a release directory that may be gone

local dict = ngx.shared.cellvisor
-- Fill times of cached answers, by cache key: a cached answer older than
-- its domain's TTL is fetched again (see serve); an evicted one counts as
-- old. Only where the configuration has a cache.
local fills = ngx.shared.cellvisor_fills

local _M = { cell = "?", pool = "", secret = nil,
    limits = { max_conns = 0, rate = 0, burst = 0 } }

-- state is what the cell serves: replaced whole by a load, never changed
-- in place, so a request that took it once sees one release throughout.
-- id names the release directory, shape is the digest of everything in it
-- but the data (a load needs the running configuration's shape).
local state = { id = "", sequence = 0, shape = "", hosts = {}, certs = {} }

-- The configuration's own release and shape (fixed for a generation of
-- workers), the directory of every release, and the bound of a release's
-- data file.
local conf_id, conf_shape, releases_dir = "", "", ""
local max_data = 64 * 1024 * 1024
-- cache_budget is limits.cache, cache_used_file where the agent writes the
-- cache's use (cache_room, below).
local cache_budget, cache_used_file = 0, nil
local MAX_META = 1024 * 1024

-- A request is accepted only within auth_window seconds of its timestamp
-- (init's opts.auth_window, 30 by default), and each nonce only once: a
-- nonce is remembered until its timestamp has left the window, so a proof
-- dated ahead of the cell's clock cannot be accepted again once its nonce
-- is forgotten.
local auth_window = 30

-- seqstr renders a sequence as the exact integer it is: tostring and
-- cjson (14 significant digits by default) would round one over 10^14 into
-- an exponent the agent cannot decode as an integer.
local function seqstr(seq)
    return string.format("%.0f", seq or state.sequence)
end

-- valid_sequence: sequences are 1 … 2^53-1, exact in a double.
local function valid_sequence(s)
    return type(s) == "number" and s >= 0 and s <= 9007199254740991 and s == math.floor(s)
end

-- release_sequence is the sequence a release directory's name starts with.
local function release_sequence(id)
    return tonumber(string.match(id or "", "^(%d+)%-%x+$"))
end

-- decode_lines reads a pool runtime written one host a line
-- ({"pool":…,"hosts":{ / "host":["digest",{…}], … / }}): a host whose
-- digest the state served has keeps its decoded table (and what was cached
-- on it) without its line even being copied; only new or changed
-- documents are decoded. It answers the hosts and their digests, or nil
-- where the data is not written so (it is then decoded whole).
local function decode_lines(data)
    local prev_hosts, prev_digests = state.hosts, state.digests or {}
    local hosts, digests = {}, {}
    local nl = string.find(data, "\n", 1, true)
    if not nl or string.sub(data, nl - 10, nl - 1) ~= ',"hosts":{' then return nil end
    local pos, len = nl + 1, #data
    while pos <= len do
        local e = string.find(data, "\n", pos, true) or (len + 1)
        if string.byte(data, pos) == 125 then break end -- the closing "}}"
        local host, digest, from = string.match(data, '^"([^"\\]+)":%["(%x+)",()', pos)
        if not host then return nil end
        local d = prev_hosts[host]
        if d == nil or prev_digests[host] ~= digest then
            local last = e - 1
            if string.byte(data, last) == 44 then last = last - 1 end -- ","
            d = cjson.decode(string.sub(data, from, last - 1)) -- up to the "]"
            if type(d) ~= "table" then return nil end
        end
        hosts[host], digests[host] = d, digest
        pos = e + 1
    end
    return hosts, digests
end

-- read_certs pairs the keys of release dir (tls/keys.json: "domain":
-- ["fingerprint","PEM key",not_after]) with the chains of its domains'
-- documents: host → { fp, domain, not_after, parsed = { chain_pem,
-- key_pem, and once parsed chain and key } }. The PEM is parsed at the
-- domain's first handshake (certificate below), not
-- here: OpenSSL 3 takes about 0.6 ms to parse a certificate and its key,
-- 0.6 s for a thousand at every start and load. What the served state
-- parsed (by fingerprint) is kept. nil and why where the keys file cannot
-- be read or decoded.
local function read_certs(dir, id, hosts)
    local data, err = cvfile.read(dir .. "/tls/keys.json", max_data, "keys of release " .. id)
    if not data then
        -- A release an older agent wrote has no keys file: no certificate.
        if string.find(err, "errno 2)", 1, true) then return {}, {} end
        return nil, err
    end
    local doc = cjson.decode(data)
    if type(doc) ~= "table" or type(doc.keys) ~= "table" then
        return nil, "keys of release " .. id .. " do not decode"
    end
    local prev = state.parsed or {}
    local certs, parsed = {}, {}
    for host, d in pairs(hosts) do
        local t = type(d) == "table" and d.tls
        local k = t and t.chain and doc.keys[d.domain]
        if type(k) == "table" and k[1] == t.fingerprint and type(k[2]) == "string" then
            local fp = k[1]
            local p = parsed[fp] or prev[fp] or { chain_pem = t.chain, key_pem = k[2] }
            parsed[fp] = p
            certs[host] = { fp = fp, domain = d, not_after = tonumber(k[3]) or 0, parsed = p }
        end
    end
    return certs, parsed
end

-- read_release reads release id (its release.json and its pool's data)
-- and builds the state it would serve, or answers nil and why. Nothing is
-- changed.
local function read_release(id)
    if not release_sequence(id) then
        return nil, "bad release name"
    end
    local dir = releases_dir .. "/" .. id
    local data, err = cvfile.read(dir .. "/release.json", MAX_META, "release.json of " .. id)
    if not data then return nil, err end
    local meta = cjson.decode(data)
    if type(meta) ~= "table" or meta.id ~= id or not valid_sequence(meta.sequence) then
        return nil, "release.json of " .. id .. " does not describe it"
    end
    if (meta.pool or "") ~= _M.pool then
        return nil, "release " .. id .. " is of pool " .. tostring(meta.pool) .. ", the cell's is " .. _M.pool, "reload"
    end
    local hosts, digests = {}, {}
    if _M.pool ~= "" then
        local pdata, perr = cvfile.read(dir .. "/pools/" .. _M.pool .. ".json", max_data, "data of release " .. id)
        if not pdata then return nil, perr end
        hosts, digests = decode_lines(pdata)
        if not hosts then
            -- Not one host a line, or a line that does not decode: decoded
            -- whole, for what it says.
            local rt, derr = cjson.decode(pdata)
            if type(rt) ~= "table" or type(rt.hosts) ~= "table" then
                return nil, "data of release " .. id .. " does not decode: " .. tostring(derr or "no hosts")
            end
            hosts, digests = {}, {}
            for h, v in pairs(rt.hosts) do
                hosts[h] = (type(v) == "table" and v[2]) or v -- ["digest", {…}], or an older agent's {…}
            end
        end
    end
    local certs, parsed = read_certs(dir, id, hosts)
    if not certs then return nil, parsed end
    -- Whether any domain has HSTS, and the origins with an active health
    -- check (once each, not once a hostname).
    local hsts, checks, seen = false, {}, {}
    for _, d in pairs(hosts) do
        if type(d) == "table" then
            if d.tls and d.tls.hsts then hsts = true end
            if not seen[d.domain] then
                seen[d.domain] = true
                for _, o in ipairs(d.origins or {}) do
                    if type(o.health_check) == "table" then checks[#checks + 1] = { d = d, o = o } end
                end
            end
        end
    end
    return { id = id, sequence = meta.sequence, shape = type(meta.shape) == "string" and meta.shape or "",
        hosts = hosts, digests = digests, certs = certs, parsed = parsed, hsts = hsts, checks = checks }
end

function _M.init(opts)
    _M.cell, _M.pool = opts.cell, opts.pool or ""
    auth_window = tonumber(opts.auth_window) or 30
    _M.expose_cell = opts.expose_cell == true
    _M.limits = opts.limits or _M.limits
    max_data = tonumber(opts.max_data) or max_data
    cache_budget, cache_used_file = tonumber(opts.cache_budget) or 0, opts.cache_used_file
    local secret, err = cvfile.read(opts.secret_file, 4096, "the cell secret")
    if not secret or #secret < 32 then
        error("cellvisor: read cell secret " .. tostring(opts.secret_file) .. ": " .. tostring(err or "too short"))
    end
    _M.secret = secret:gsub("%s+$", "")
    -- The agent's persisted drained state seeds the flag on a fresh start; a
    -- reload keeps the flag the private endpoint last set (add() does not
    -- overwrite).
    dict:add("drained", cvfile.read(opts.drained_file, 4096, "the drained marker") ~= nil)
    releases_dir, conf_id = string.match(opts.release_dir or "", "^(.*)/([^/]+)$")
    local st, rerr = read_release(conf_id)
    if not st then
        error("cellvisor: read release: " .. tostring(rerr))
    end
    conf_shape, state = st.shape, st
end

-- collect_soon frees what a load replaced in small steps, yielding to
-- requests between them, rather than at the collector's pace (the
-- worker's memory would hold two or three releases' data) or in one full
-- collection (every request would wait for it).
local collecting = false

local function collect_steps(premature)
    if not premature then
        local cycles = 0
        -- Two cycles: the one under way may have marked the old state live.
        while cycles < 2 do
            if collectgarbage("step", 64) then
                cycles = cycles + 1
            end
            ngx.sleep(0)
        end
    end
    collecting = false
end

local function collect_soon()
    if collecting then return end
    collecting = ngx.timer.at(0, collect_steps) ~= nil
end

-- load makes the cell serve release id, built aside and swapped in one
-- step; nil and why (the state unchanged) where it cannot: a release of
-- another shape needs a reload, an older one is refused.
local function load(id)
    if id == state.id then return true end
    local seq = release_sequence(id)
    if not seq or seq <= state.sequence then
        return nil, "release " .. tostring(id) .. " is not newer than the one served (" .. state.id .. ")", "older"
    end
    ngx.update_time()
    local t0 = ngx.now()
    local st, err, kind = read_release(id)
    if not st then return nil, err, kind or "failed" end
    if st.shape ~= conf_shape or st.shape == "" then
        return nil, "release " .. id .. " changes the configuration, not only data: it needs a reload", "reload"
    end
    state = st
    dict:set("loaded", id)
    ngx.update_time()
    dict:set("load:last_ms", math.floor((ngx.now() - t0) * 1000 + 0.5))
    dict:incr("load:count", 1, 0)
    collect_soon()
    return true
end

local active_checks -- below, with the origins' health

-- init_worker runs in every new worker: one that replaces a crashed
-- worker finds the release the old one had loaded since the configuration
-- was read (the shared dict keeps its name), and serves it too.
function _M.init_worker()
    cvdns.init_worker()
    if ngx.worker.id() == 0 then
        ngx.timer.every(1, active_checks)
    end
    local id = dict:get("loaded")
    local seq = release_sequence(id)
    if not seq or seq <= state.sequence then
        -- A reload's first worker: its configuration's release is the newest.
        dict:set("loaded", state.id)
        return
    end
    local ok, err = load(id)
    if not ok then
        ngx.log(ngx.ERR, "cellvisor: worker start: serving ", state.id, ", not loaded ", id, ": ", err)
        dict:set("loaded", state.id)
    end
end

local function lookup(hosts, host)
    host = string.lower(host or "")
    local d = hosts[host]
    if d then return d end
    local dot = string.find(host, ".", 1, true)
    if dot then return hosts["*" .. string.sub(host, dot)] end
end

-- ready answers the readiness probe: 200, or 503 while drained. The
-- cell's name and sequence only where the operator exposes the cell: the
-- public port tells nothing of the host's topology.
function _M.ready()
    ngx.header["Content-Type"] = "text/plain"
    if dict:get("drained") then
        ngx.status = 503
        if _M.expose_cell then ngx.say("draining ", _M.cell) else ngx.say("draining") end
        return ngx.exit(503)
    end
    if _M.expose_cell then
        ngx.say("ready ", _M.cell, " sequence ", seqstr(state.sequence))
    else
        ngx.say("ready")
    end
end

-- normalize is the path routes are matched on and the origin receives:
-- nginx's $uri (decoded once, dot segments resolved, slashes merged)
-- decoded again until nothing is encoded (at most three rounds: "%2561"
-- is "a" to an origin that decodes twice), backslashes as slashes (they
-- are to some origins), path parameters (";...") dropped, and dot segments
-- and repeated slashes resolved once more. So an edge rule on /admin is not
-- passed by /%2561dmin, /;/admin, /x/..%5cadmin or //admin. nil for a path
-- still encoded after three rounds, or holding a control character.
local function normalize(path)
    -- Nothing to decode, no backslash, no path parameter, no control byte:
    -- nginx's $uri is normalised already (the common case, on every request).
    if not string.find(path, "[%%\\;%c]") then
        return path
    end
    local p = path
    for _ = 1, 3 do
        local q = string.gsub(p, "%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end)
        if q == p then break end
        p = q
    end
    if string.find(p, "%%%x%x") or string.find(p, "%c") then
        return nil
    end
    p = string.gsub(p, "\\", "/")
    p = string.gsub(p, ";[^/]*", "")
    local out = {}
    for seg in string.gmatch(p, "[^/]+") do
        if seg == ".." then
            out[#out] = nil
        elseif seg ~= "." then
            out[#out + 1] = seg
        end
    end
    local n = "/" .. table.concat(out, "/")
    if #out > 0 and string.sub(p, -1) == "/" then
        n = n .. "/"
    end
    return n
end

-- escape_path percent-encodes what may not stand as it is in a path.
local unsafe_in_path = "[^%w%-%._~/!%$&'%(%)%*%+,=:@]"

local function escape_path(p)
    if not string.find(p, unsafe_in_path) then
        return p
    end
    return (string.gsub(p, unsafe_in_path, function(c)
        return string.format("%%%02X", string.byte(c))
    end))
end

-- answer ends the request with a plain-text answer the cell makes itself
-- (from the access phase: ngx.exit(200) ends it as sent).
local function answer(status, text)
    ngx.status = status
    ngx.header["Content-Type"] = "text/plain"
    ngx.say(text)
    return ngx.exit(ngx.HTTP_OK)
end

local cache_check

-- The cache's budget (limits.cache) holds on disk at any instant: nginx's
-- manager keeps the cache to three quarters of it, but looks only now and
-- then, while a cell fills at tens of MiB a second. So a fresh answer is
-- stored only while the cache has room for it: what the agent last
-- measured the cache to hold (written to cache_used_file at each of its
-- looks, "BYTES UNIX_MS") plus what this cell stored since (an answer's
-- Content-Length, at least 4 KiB; one without counts a sixteenth of the
-- budget), within nine tenths of the budget. Past it the answer is served,
-- not stored, and counted (cache.full). With no measure yet (an agent that
-- writes none), nginx's manager alone keeps the budget.
local used_bytes, used_at, used_read = 0, 0, 0
-- stored_at and stored_len are the answers stored since a second before
-- the last measure (one being written then may not be in it), stored_sum
-- their lengths.
local stored_at, stored_len, stored_sum = {}, {}, 0

local function read_cache_use(now)
    used_read = now
    local data = cvfile.read(cache_used_file, 64, "cache use")
    local b, ms = string.match(data or "", "^(%d+) (%d+)")
    if not b then return end
    local at = tonumber(ms) / 1000
    if at == used_at then return end
    used_bytes, used_at = tonumber(b), at
    local keep_at, keep_len, sum = {}, {}, 0
    for i = 1, #stored_at do
        if stored_at[i] >= at - 1 then
            keep_at[#keep_at + 1], keep_len[#keep_len + 1] = stored_at[i], stored_len[i]
            sum = sum + stored_len[i]
        end
    end
    stored_at, stored_len, stored_sum = keep_at, keep_len, sum
end

-- cache_room tells whether an answer of len bytes may be stored, and
-- counts it as stored when so.
local function cache_room(len)
    if cache_budget <= 0 or not cache_used_file then return true end
    local now = ngx.now()
    if now - used_read >= 0.05 then read_cache_use(now) end
    if used_at == 0 then return true end
    -- A file takes at least a block (and an entry's header): this also
    -- bounds the answers counted to budget / 4 KiB.
    len = math.max(len or cache_budget / 16, 4096)
    if used_bytes + stored_sum + len > cache_budget * 0.9 then return false end
    stored_at[#stored_at + 1], stored_len[#stored_len + 1] = now, len
    stored_sum = stored_sum + len
    return true
end

-- stored_now are the cache statuses of an answer fetched and, unless kept
-- out, stored; stored_statuses the statuses the cached location keeps
-- (proxy_cache_valid in nginx.conf).
local stored_now = { MISS = true, EXPIRED = true, BYPASS = true }
local stored_statuses = { [200] = true, [301] = true, [404] = true }

-- headers runs in every answer's header filter: it clears what would name
-- the server to the public (nginx's Server header: server_tokens off still
-- sends "nginx"), and on a cached route keeps out of the cache an answer
-- with private, no-store or no-cache in any of its Cache-Control lines
-- (nginx's own check reads only the first line).
function _M.headers()
    ngx.header["Server"] = nil
    local hsts = state.hsts and ngx.ctx.cv_hsts -- ngx.ctx costs a table: only where a domain has HSTS
    if hsts then
        ngx.header["Strict-Transport-Security"] = hsts
    end
    if fills and ngx.var.cv_ttl ~= "" then
        cache_check()
    end
end

function cache_check()
    local v = ngx.var
    local cc = ngx.header["Cache-Control"] -- every line, as a table if several
    if type(cc) == "table" then
        cc = table.concat(cc, ",")
    end
    if type(cc) == "string" then
        cc = string.lower(cc)
        if string.find(cc, "private", 1, true) or string.find(cc, "no-store", 1, true)
            or string.find(cc, "no-cache", 1, true) then
            v.cv_private = "1"
            return
        end
    end
    if stored_now[v.upstream_cache_status] and stored_statuses[ngx.status] and v.cv_no_store == ""
        and not v.http_authorization and (v.cv_cookie or "") == ""
        and not cache_room(tonumber(ngx.header["Content-Length"])) then
        v.cv_full = "1"
        dict:incr("cache:full", 1, 0)
    end
end

-- parse_server reads one server URL: its host, its address (nil for a
-- name to resolve), its port, whether it is TLS.
local function parse_server(url)
    local scheme, hostport = string.match(url or "", "^(https?)://(.+)$")
    local host, port = string.match(hostport or "", "^%[(.+)%]:?(%d*)$")
    local ip
    if host then
        ip = host
    else
        host, port = string.match(hostport or "", "^([^:]+):?(%d*)$")
        if host and string.match(host, "^%d+%.%d+%.%d+%.%d+$") then ip = host end
    end
    local tls = scheme == "https"
    return { url = url, host = host or "", ip = ip, tls = tls,
        port = tonumber(port ~= "" and port) or (tls and 443 or 80) }
end

-- target is what routing needs of origin o, parsed once per origin of a
-- release (kept on the origin's table): its servers with their weights,
-- the upstream block, the TLS name, whether it is verified, and the
-- timeouts in seconds.
local function target(o)
    local t = o._target
    if t then return t end
    local servers, total = {}, 0
    if type(o.servers) == "table" and #o.servers > 0 then
        for _, sv in ipairs(o.servers) do
            local p = parse_server(sv.url)
            p.weight = math.max(1, tonumber(sv.weight) or 1)
            servers[#servers + 1] = p
            total = total + p.weight
        end
    else
        local p = parse_server(o.url)
        p.weight, total = 1, 1
        servers[1] = p
    end
    local first = servers[1]
    local to = type(o.timeouts) == "table" and o.timeouts or {}
    local function secs(ms, default)
        ms = tonumber(ms)
        return (ms and ms > 0) and ms / 1000 or default
    end
    t = {
        servers = servers, total = total,
        upstream = first.tls and "https://cv_origins_tls" or "http://cv_origins",
        sni = first.tls and (o.sni or (not first.ip and first.host) or "") or "",
        verify = not first.tls or o.tls_verify ~= false,
        -- An origin with its own CA bundle is verified in that bundle's
        -- location (named by its MD5, as the release names it).
        ca = first.tls and o.tls_verify ~= false and type(o.ca) == "string" and o.ca ~= "" and ngx.md5(o.ca) or nil,
        timeouts = string.format("%g %g %g", secs(to.connect_ms, 5), secs(to.send_ms, 60), secs(to.read_ms, 60)),
    }
    o._target = t
    return t
end

-- Passive health of origin servers, in the worker, by origin and server
-- URL (kept across loads: a publish does not forget a server that is
-- down): a server whose requests failed FAIL_LIMIT times in a row is
-- skipped for DOWN_SECONDS, then tried again.
local FAIL_LIMIT, DOWN_SECONDS = 3, 10
local health = {}
local health_count = 0

local function health_of(key)
    local h = health[key]
    if not h then
        if health_count >= 10000 then health, health_count = {}, 0 end
        h = { fails = 0, down_until = 0, failures = 0, retries = 0,
            checks = 0, check_failures = 0, checked_at = 0, check_interval = 10 }
        health[key], health_count = h, health_count + 1
    end
    return h
end

-- pick chooses a server of t by weight among those not down (any, when
-- all are), other than index skip.
local function pick(t, origin, skip)
    local servers = t.servers
    if #servers == 1 then return skip ~= 1 and 1 or nil end
    local now = ngx.now()
    local up, total = {}, 0
    for i, sv in ipairs(servers) do
        local h = health[origin .. " " .. sv.url]
        if i ~= skip and not (h and h.down_until > now) then
            up[#up + 1], total = i, total + sv.weight
        end
    end
    if #up == 0 then
        for i = 1, #servers do
            if i ~= skip then up[#up + 1], total = i, total + servers[i].weight end
        end
        if #up == 0 then return nil end
    end
    local r = math.random() * total
    for _, i in ipairs(up) do
        r = r - servers[i].weight
        if r <= 0 then return i end
    end
    return up[#up]
end

-- note_servers records, in the log phase, how each server tried for the
-- request did ($upstream_status: one status per try, "502" where nginx
-- could not get an answer), from $cv_servers (the servers tried, in order).
local function note_servers(origin, tried, statuses)
    local i = 0
    for st in string.gmatch(statuses, "[^,%s:]+") do
        i = i + 1
        local url = tried[i]
        if not url then return end
        local h = health_of(origin .. " " .. url)
        if i > 1 then h.retries = h.retries + 1 end
        local code = tonumber(st) or 502
        if code >= 500 then
            h.failures, h.fails = h.failures + 1, h.fails + 1
            if h.fails >= FAIL_LIMIT then
                h.down_until = ngx.now() + DOWN_SECONDS
            end
        else
            h.fails, h.down_until = 0, 0
        end
    end
end

-- note_failure records a passive-origin failure of origin (domain/name)
-- with its reason (one of cellapi.OriginReasons, then ": detail" where
-- the cell knows more).
local function note_failure(origin, status, reason)
    local key = "origin:" .. origin
    local rec = cjson.decode(dict:get(key) or "{}") or {}
    rec.failures = (rec.failures or 0) + 1
    rec.last_failure_at = ngx.now()
    rec.last_status = status
    rec.last_reason = reason
    local kind = string.match(reason, "^[%w_]+")
    if type(rec.reasons) ~= "table" then rec.reasons = {} end
    rec.reasons[kind] = (rec.reasons[kind] or 0) + 1
    dict:set(key, cjson.encode(rec))
end

-- Active health checks (an origin's health_check): every second the
-- worker starts the checks that are due, at most MAX_CHECKS at once. A
-- check asks the server for the path on a new connection (TLS as the
-- origin's requests, verified the same way) with the domain's first
-- hostname as Host; an answer of 200-399 in time passes. A server that
-- fails is skipped until a check passes (or two intervals go by without
-- one); one that passes is taken back at once.
local MAX_CHECKS = 32
local checking, running_checks = {}, 0

local function check_server(premature, key, sv, path, timeout, host, sni, verify)
    local ok, err = false, nil
    if not premature then
        local addr = sv.ip
        if not addr then addr, err = cvdns.resolve(sv.host) end
        if addr then
            local sock = ngx.socket.tcp()
            sock:settimeouts(timeout, timeout, timeout)
            ok, err = sock:connect(addr, sv.port)
            if ok and sv.tls then
                ok, err = sock:sslhandshake(nil, sni ~= "" and sni or nil, verify)
            end
            if ok then
                ok, err = sock:send("GET " .. path .. " HTTP/1.1\r\nHost: " .. host ..
                    "\r\nUser-Agent: cellvisor-health-check\r\nConnection: close\r\n\r\n")
            end
            -- The status line's first 12 bytes ("HTTP/1.1 200") and no
            -- more: a server that trickles an endless line is not waited on
            -- past them (each read has the timeout).
            local line
            if ok then line, err = sock:receive(12) end
            sock:close()
            ok = false
            if line then
                local code = tonumber(string.match(line, "^HTTP/%d%.%d (%d%d%d)$"))
                ok = code ~= nil and code >= 200 and code < 400
                if not ok then err = "answered " .. string.sub(line, 1, 64) end
            end
        end
        local h = health_of(key)
        ngx.update_time()
        h.checks, h.checked_at = h.checks + 1, ngx.now()
        if ok then
            h.fails, h.down_until, h.check_error = 0, 0, nil
        else
            h.check_failures, h.check_error = h.check_failures + 1, tostring(err)
            h.down_until = ngx.now() + 2 * h.check_interval
        end
    end
    checking[key], running_checks = nil, running_checks - 1
end

function active_checks(premature)
    if premature then return end
    local now = ngx.now()
    for _, c in ipairs(state.checks or {}) do
        local d, o = c.d, c.o
        local hc, t = o.health_check, target(o)
        local interval = tonumber(hc.interval_seconds) or 0
        if interval <= 0 then interval = 10 end
        local timeout = tonumber(hc.timeout_ms) or 0
        if timeout <= 0 then timeout = 1000 end
        local host = d.domain
        for _, hn in ipairs(d.hostnames or {}) do
            if string.sub(hn, 1, 2) ~= "*." then host = hn; break end
        end
        for _, sv in ipairs(t.servers) do
            local key = d.domain .. "/" .. o.name .. " " .. sv.url
            local h = health_of(key)
            if not checking[key] and now - h.checked_at >= interval then
                if running_checks >= MAX_CHECKS then return end
                h.check_interval = interval
                -- The Lua has one trust store (lua_ssl_trusted_certificate):
                -- an origin with its own CA bundle is checked without
                -- verifying its certificate; its requests verify it.
                if ngx.timer.at(0, check_server, key, sv, hc.path, timeout, host, t.sni, t.verify and not t.ca) then
                    checking[key], running_checks = true, running_checks + 1
                end
            end
        end
    end
end

-- balance runs in the balancer phase of the origin upstreams: the server
-- serve() chose, then, on the retry nginx makes after an error or a
-- timeout (of an idempotent request), the other one, with the origin's
-- timeouts ($cv_target: "connect send read addr port [addr port]").
function _M.balance()
    local c, s, r, rest = string.match(ngx.var.cv_target, "^(%S+) (%S+) (%S+) (.+)$")
    local peers = {}
    for addr, port in string.gmatch(rest or "", "(%S+) (%d+)") do
        peers[#peers + 1] = { addr, tonumber(port) }
    end
    local try = (balancer.get_last_failure() and 2) or 1
    local p = peers[try] or peers[1]
    if not p then
        return ngx.exit(502)
    end
    local ok, err = balancer.set_current_peer(p[1], p[2])
    if not ok then
        ngx.log(ngx.ERR, "cellvisor: origin peer ", tostring(p[1]), ": ", err)
        return ngx.exit(502)
    end
    if try == 1 and peers[2] then
        balancer.set_more_tries(1)
    end
    balancer.set_timeouts(tonumber(c), tonumber(s), tonumber(r))
end

-- cache_key is the key of fills for a request: the MD5 of the cache's own
-- key (proxy_cache_key in nginx.conf: $scheme$host$cv_path$is_args$args),
-- from those values (serve has host and path at hand already).
local function cache_key(scheme, host, path, args)
    if args then
        return ngx.md5_bin(scheme .. host .. path .. "?" .. args)
    end
    return ngx.md5_bin(scheme .. host .. path)
end

-- note_fill records, in the log phase of a cached route, that the cache
-- stored a fresh answer now (fetched, not served from the cache, of a
-- status it keeps, and nothing kept it out): it is served from the cache
-- for its domain's TTL from now.
local function note_fill(cs)
    if cs ~= "MISS" and cs ~= "EXPIRED" and cs ~= "BYPASS" then return end
    local v = ngx.var
    local ttl = tonumber(v.cv_ttl)
    if not fills or not ttl or ttl <= 0 then return end
    if not stored_statuses[ngx.status] or v.cv_no_store ~= "" or v.cv_private ~= "" or v.cv_full ~= ""
        or v.http_authorization or (v.cv_cookie or "") ~= "" then
        return
    end
    -- Forgotten once no TTL would keep it (the longest a domain may have).
    fills:set(cache_key(v.scheme, v.host, v.cv_path, v.args), ngx.now(), 31536000)
end

-- only_ignored reports whether every cookie of a Cookie header is one the
-- domain's cache ignores.
local function only_ignored(cache, header)
    local set = cache._ignore
    if not set then
        set = {}
        for _, name in ipairs(cache.ignore_cookies) do set[name] = true end
        cache._ignore = set
    end
    for name in string.gmatch(header, "([^=;%s]+)=[^;]*") do
        if not set[name] then return false end
    end
    return true
end

-- to_origin sends the request to origin o of domain d: the location's
-- proxy_pass takes it on once the access phase ends, through the upstream
-- block whose balancer sets the servers chosen here (one, and another for
-- a retry where the origin has several).
local function to_origin(d, o, uri, host)
    local t = target(o)
    local name = o._key
    if not name then
        name = d.domain .. "/" .. o.name
        o._key = name
    end
    local target_str, servers_str
    local sv1 = t.servers[1]
    if #t.servers == 1 and sv1.ip then
        -- One server by address (the common origin): what the balancer
        -- needs is the same on every request, made once.
        target_str, servers_str = t.fixed, sv1.url
        if not target_str then
            target_str = t.timeouts .. " " .. sv1.ip .. " " .. sv1.port
            t.fixed = target_str
        end
    else
        local first = pick(t, name)
        local second = pick(t, name, first)
        local peers, tried = {}, {}
        for _, i in ipairs({ first, second }) do
            local sv = t.servers[i]
            local addr, err = sv.ip, nil
            if not addr then
                addr, err = cvdns.resolve(sv.host)
            end
            if addr then
                peers[#peers + 1] = addr .. " " .. sv.port
                tried[#tried + 1] = sv.url
            elseif #peers == 0 and i == first and not second then
                -- No upstream was tried: recorded here, not by log().
                note_failure(name, 502, "resolve: " .. tostring(err))
                return ngx.exit(502)
            end
        end
        if #peers == 0 then
            note_failure(name, 502, "resolve: no server of the origin resolves")
            return ngx.exit(502)
        end
        target_str, servers_str = t.timeouts .. " " .. table.concat(peers, " "), table.concat(tried, " ")
    end
    local v = ngx.var
    -- In variables, not ngx.ctx: an error page's redirect (the origin's
    -- 502) and the ones to @origin_insecure and @origin_ca_* clear ngx.ctx.
    v.cv_origin_name = name
    v.cv_servers = servers_str
    if d.trust_forwarded then
        local xff, xfp = v.http_x_forwarded_for, v.http_x_forwarded_proto
        if xff and xff ~= "" then v.cv_xff = xff .. ", " .. v.remote_addr end
        if xfp == "http" or xfp == "https" then v.cv_xfp = xfp end
    end
    v.cv_target = target_str
    local path
    if d.raw_path then
        -- The path as the client sent it (the query goes on as $args).
        path = string.match(v.request_uri, "^[^?]*")
    else
        path = escape_path(uri)
    end
    v.cv_path = path
    v.cv_upstream = t.upstream
    if t.sni ~= "" then v.cv_sni = t.sni end
    -- A domain with a cache TTL has its answers cached; one stored longer
    -- ago than the TTL (or not known to this cell's fills) is fetched again
    -- and stored anew.
    local ttl = type(d.cache) == "table" and tonumber(d.cache.ttl_seconds) or 0
    if fills and ttl and ttl > 0 then
        v.cv_cache = "cell_cache"
        if d.cache.ignore_cookies and v.http_cookie and only_ignored(d.cache, v.http_cookie) then
            v.cv_cookie = "" -- cookies that personalise nothing: cached
        end
        local ttls = d.cache._ttl
        if not ttls then
            ttls = string.format("%d", ttl)
            d.cache._ttl = ttls
        end
        v.cv_ttl = ttls
        local stored = fills:get(cache_key(v.scheme, host, path, v.args))
        if not stored then
            v.cv_refresh = "miss"
        elseif ngx.now() - stored >= ttl then
            v.cv_refresh = "expired"
        end
    end
    if not t.verify then
        return ngx.exec("@origin_insecure")
    end
    if t.ca then
        return ngx.exec("@origin_ca_" .. t.ca)
    end
end

-- certificate runs in the TLS handshake (ssl_certificate_by_lua): it
-- presents the certificate of the domain the client's SNI names, and
-- refuses the handshake for a name the cell has no certificate for, or
-- none. A TLS 1.2 session resumed from the cache does not come here (1.3
-- resumptions do: OpenSSL asks for the certificate before it knows).
function _M.certificate()
    local name = ssl.server_name()
    local c = name and lookup(state.certs, name)
    if not c then
        dict:incr(name and "tls:unknown_name" or "tls:no_name", 1, 0)
        return ngx.exit(ngx.ERROR)
    end
    local p = c.parsed
    if not p.chain then
        if p.bad then return ngx.exit(ngx.ERROR) end
        -- The domain's first handshake: parsed once, for every later one
        -- (and every later release with this certificate).
        local chain, cerr = ssl.parse_pem_cert(p.chain_pem)
        local key, kerr = ssl.parse_pem_priv_key(p.key_pem)
        if not chain or not key then
            p.bad = true
            dict:incr("tls:bad_certificate", 1, 0)
            ngx.log(ngx.ERR, "cellvisor: the certificate of ", c.domain.domain, " (", c.fp, ") does not parse: ",
                tostring(cerr or kerr), ": its handshakes are refused")
            return ngx.exit(ngx.ERROR)
        end
        p.chain, p.key = chain, key
    end
    local ok, err = ssl.clear_certs()
    if ok then ok, err = ssl.set_cert(p.chain) end
    if ok then ok, err = ssl.set_priv_key(p.key) end
    if not ok then
        ngx.log(ngx.ERR, "cellvisor: certificate of ", c.domain.domain, ": ", err)
        return ngx.exit(ngx.ERROR)
    end
end

-- tls_first answers what a domain with tls does before its routes: an ACME
-- HTTP-01 challenge it has pending (on either port), and, on the HTTP
-- port, the redirect to https once the cell holds its certificate.
local acme_prefix = "/.well-known/acme-challenge/"

local function tls_first(t, host)
    if t.acme_challenges then
        local uri = ngx.var.uri
        if string.sub(uri, 1, #acme_prefix) == acme_prefix then
            local token = string.sub(uri, #acme_prefix + 1)
            for _, c in ipairs(t.acme_challenges) do
                if c.token == token then
                    ngx.header["Content-Type"] = "text/plain"
                    ngx.print(c.key_authorization)
                    return ngx.exit(ngx.HTTP_OK)
                end
            end
        end
    end
    local h = t.hsts
    if not t.redirect_http and not h then return end
    local https = ngx.var.https == "on"
    if t.redirect_http and not https and lookup(state.certs, host) then
        -- The public face of the cell's ports is 80 and 443: no port.
        return ngx.redirect("https://" .. string.lower(host) .. ngx.var.request_uri, 301)
    end
    if h and https then
        -- Added by the header filter, to the origin's answers too.
        local v = h._value
        if not v then
            v = "max-age=" .. string.format("%d", h.max_age_seconds)
                .. (h.include_subdomains and "; includeSubDomains" or "") .. (h.preload and "; preload" or "")
            h._value = v
        end
        ngx.ctx.cv_hsts = v
    end
end

function _M.serve()
    local host = ngx.var.host
    local d = lookup(state.hosts, host)
    if not d then
        return answer(404, "no such domain")
    end
    if d.tls then
        tls_first(d.tls, host)
    end
    local uri = normalize(ngx.var.uri)
    if not uri then
        return answer(400, "ambiguous path")
    end
    local best
    if d.case_insensitive then
        local luri = string.lower(uri)
        for _, r in ipairs(d.routes or {}) do
            local p = r._lower
            if not p then p = string.lower(r.prefix); r._lower = p end
            if string.sub(luri, 1, #p) == p and (not best or #p > #best.prefix) then
                best = r
            end
        end
    else
        for _, r in ipairs(d.routes or {}) do
            if string.sub(uri, 1, #r.prefix) == r.prefix and (not best or #r.prefix > #best.prefix) then
                best = r
            end
        end
    end
    if not best then
        return answer(404, "no route")
    end
    if _M.expose_cell then
        ngx.header["X-Cellvisor-Cell"] = _M.cell
    end
    if best.respond then
        ngx.status = best.respond.status
        ngx.header["Content-Type"] = best.respond.content_type or "text/plain"
        -- Sent first: an empty body is the domain's answer, not an error
        -- for the server's error page to fill.
        ngx.send_headers()
        ngx.print(best.respond.body)
        return ngx.exit(ngx.HTTP_OK)
    end
    for _, o in ipairs(d.origins or {}) do
        if o.name == best.origin then
            return to_origin(d, o, uri, host)
        end
    end
    return ngx.exit(502)
end

-- Answers of the cache that served a request without asking the origin.
local served_from_cache = { HIT = true, STALE = true, UPDATING = true }

-- log() runs for every public request: it gives back its body's
-- reservation, counts it, counts the pool limits' refusals by kind and the
-- cache's answers, and, for proxied ones, records a passive-origin failure
-- with its reason when the origin failed (origin_fault), never for what
-- the client did.
function _M.log()
    _M.release_body()
    dict:incr("requests", 1, 0)
    -- A request a shutting-down worker ended before it completed: cut by
    -- the end of a reload's or a stop's grace (worker_shutdown_timeout).
    if ngx.worker.exiting() and ngx.var.request_completion ~= "OK" then
        dict:incr("cut:shutdown", 1, 0)
    end
    local limits = _M.limits
    if limits.max_conns > 0 and ngx.var.limit_conn_status == "REJECTED" then
        dict:incr("refused:connections", 1, 0)
        return
    end
    if limits.rate > 0 and ngx.var.limit_req_status == "REJECTED" then
        dict:incr("refused:rate", 1, 0)
        return
    end
    local origin = ngx.var.cv_origin_name
    if origin == nil or origin == "" then return end
    local cs = ngx.var.upstream_cache_status
    if cs and cs ~= "" then
        note_fill(cs)
        -- A fetch past the domain's TTL (or of an answer this cell did not
        -- store) is the cache's expiry (or miss), not a client's bypass.
        local refresh = ngx.var.cv_refresh
        local kind = (cs == "BYPASS" and refresh ~= "") and refresh or string.lower(cs)
        dict:incr("cache:" .. kind, 1, 0)
        if served_from_cache[cs] then return end
    end
    local us = ngx.var.upstream_status or ""
    local servers = ngx.var.cv_servers
    if servers and servers ~= "" and us ~= "" then
        local b = string.byte(us, 1)
        if b and b < 53 and not string.find(us, "[ ,:]") then
            -- One try, answered below 500 (most requests): all there is to
            -- note is a server that had failed answering again.
            -- (cv_servers names the retry's server too, after the first.)
            local sp = string.find(servers, " ", 1, true)
            local h = health[origin .. " " .. (sp and string.sub(servers, 1, sp - 1) or servers)]
            if h and (h.fails ~= 0 or h.down_until ~= 0) then
                h.fails, h.down_until = 0, 0
            end
            return
        end
        local tried = {}
        for url in string.gmatch(servers, "%S+") do tried[#tried + 1] = url end
        note_servers(origin, tried, us)
    end
    local reason, status = _M.origin_fault(us)
    if not reason then return end
    note_failure(origin, status, reason)
end

-- Authentication of private calls: HMAC-SHA1 (RFC 2104; ngx_lua's built-in
-- MAC, still sound as an HMAC) with the cell secret over
-- "METHOD\nPATH\nTIMESTAMP\nNONCE", hex in X-Cellvisor-Auth, with
-- X-Cellvisor-Time (unix seconds) and X-Cellvisor-Nonce. Stale timestamps and
-- reused nonces are refused, so a captured call cannot be replayed.
local function tohex(s)
    return (s:gsub(".", function(c) return string.format("%02x", string.byte(c)) end))
end

local function equal(a, b)
    if #a ~= #b then return false end
    local acc = 0
    for i = 1, #a do
        acc = bit.bor(acc, bit.bxor(string.byte(a, i), string.byte(b, i)))
    end
    return acc == 0
end

local function refuse(reason)
    dict:incr("sec:auth_failures", 1, 0)
    dict:set("sec:last_at", ngx.now())
    dict:set("sec:last_reason", reason .. " (" .. ngx.req.get_method() .. " " .. ngx.var.uri .. ")")
    ngx.log(ngx.WARN, "cellvisor: refused private call: ", reason)
    ngx.status = 401
    ngx.header["Content-Type"] = "application/json"
    ngx.say(cjson.encode({ error = "unauthorized", reason = reason }))
    return ngx.exit(401)
end

-- expired answers a correctly signed call taken up after its caller's
-- deadline: the agent's own call, queued while
-- this cell was stalled, whose caller has given up. Nothing is done with it,
-- and it is counted apart from the security events: no one attacked.
local function expired(reason)
    dict:incr("sec:expired", 1, 0)
    ngx.status = 408
    ngx.header["Content-Type"] = "application/json"
    ngx.say(cjson.encode({ error = "expired", reason = reason }))
    -- Not ngx.exit(408): nginx finalizes a 408 by closing the connection
    -- without an answer. The 408 is sent; this ends the request.
    return ngx.exit(ngx.HTTP_OK)
end

local function authenticate()
    local h = ngx.req.get_headers()
    local ts, nonce, mac = h["X-Cellvisor-Time"], h["X-Cellvisor-Nonce"], h["X-Cellvisor-Auth"]
    if type(ts) ~= "string" or type(nonce) ~= "string" or type(mac) ~= "string" then
        return refuse("missing credentials")
    end
    local t = tonumber(ts)
    if not t or t ~= math.floor(t) then
        return refuse("bad timestamp")
    end
    if #nonce < 16 or #nonce > 64 then
        return refuse("bad nonce")
    end
    -- The signature first: only a call made with the secret can be told
    -- apart as late rather than hostile.
    local msg = ngx.req.get_method() .. "\n" .. ngx.var.uri .. "\n" .. ts .. "\n" .. nonce
    if not equal(tohex(ngx.hmac_sha1(_M.secret, msg)), string.lower(mac)) then
        return refuse("bad signature")
    end
    local deadline = tonumber(h["X-Cellvisor-Deadline"])
    if deadline and ngx.now() * 1000 > deadline then
        return expired("taken up after the caller's deadline")
    end
    -- Outside the window with a deadline not yet passed (or none): not the
    -- agent's own queued call (its calls carry a deadline well inside the
    -- window, caught above), but a proof replayed or forged around its
    -- time: a security event.
    if math.abs(ngx.time() - t) > auth_window then
        return refuse("stale timestamp")
    end
    -- Only a correctly signed call consumes its nonce. It is kept until the
    -- timestamp can no longer be accepted: ngx.time() is whole seconds, so
    -- the proof is good while ngx.now() < t + window + 1; a second more
    -- covers the cached clock's lag.
    local keep = t + auth_window + 2 - ngx.now()
    local ok, err = dict:add("nonce:" .. nonce, true, keep > 1 and keep or 1)
    if not ok then
        return refuse(err == "exists" and "replayed nonce" or ("nonce store: " .. tostring(err)))
    end
    return true
end

-- origins is an object keyed by origin (an empty Lua table encodes as {},
-- and not every lua-cjson can encode an empty array).
local function origins()
    local out = {}
    for _, key in ipairs(dict:get_keys(1024)) do
        local name = string.match(key, "^origin:(.+)$")
        if name then
            out[name] = cjson.decode(dict:get(key) or "{}") or {}
        end
    end
    return out
end

-- origin_servers are the servers' passive health this worker has seen,
-- keyed by "domain/origin server-url".
local function origin_servers()
    local out, now = {}, ngx.now()
    for key, h in pairs(health) do
        out[key] = { up = h.down_until <= now, failures = h.failures, retries = h.retries,
            checks = h.checks, check_failures = h.check_failures, last_check_error = h.check_error or "" }
    end
    return out
end

-- tls_certificates are the certificates the cell presents, by domain:
-- fingerprint and expiry (Unix seconds).
local function tls_certificates()
    local out = {}
    for _, c in pairs(state.certs or {}) do
        out[c.domain.domain] = { fingerprint = c.fp, not_after = c.not_after }
    end
    return out
end

local function status_doc()
    return {
        cell = _M.cell,
        pool = _M.pool,
        sequence = state.sequence,
        release = state.id,
        shape = conf_shape,
        conf_release = conf_id,
        worker_pid = ngx.worker.pid(),
        lua_kb = math.floor(collectgarbage("count")),
        loads = {
            count = dict:get("load:count") or 0,
            failures = dict:get("load:failures") or 0,
            last_ms = dict:get("load:last_ms") or 0,
            last_error = dict:get("load:last_error") or "",
        },
        cut = {
            shutdown = dict:get("cut:shutdown") or 0,
        },
        drained = dict:get("drained") == true,
        listening = true,
        connections = {
            active = tonumber(ngx.var.connections_active) or 0,
            reading = tonumber(ngx.var.connections_reading) or 0,
            writing = tonumber(ngx.var.connections_writing) or 0,
            waiting = tonumber(ngx.var.connections_waiting) or 0,
        },
        requests = dict:get("requests") or 0,
        limits = _M.limits,
        refused = {
            connections = dict:get("refused:connections") or 0,
            rate = dict:get("refused:rate") or 0,
        },
        cache = {
            hit = dict:get("cache:hit") or 0,
            miss = dict:get("cache:miss") or 0,
            expired = dict:get("cache:expired") or 0,
            bypass = dict:get("cache:bypass") or 0,
            stale = dict:get("cache:stale") or 0,
            updating = dict:get("cache:updating") or 0,
            revalidated = dict:get("cache:revalidated") or 0,
            full = dict:get("cache:full") or 0,
        },
        origins = origins(),
        origin_servers = origin_servers(),
        tls = {
            certificates = tls_certificates(),
            unknown_name = dict:get("tls:unknown_name") or 0,
            bad_certificate = dict:get("tls:bad_certificate") or 0,
            no_name = dict:get("tls:no_name") or 0,
        },
        security = {
            auth_failures = dict:get("sec:auth_failures") or 0,
            last_at = dict:get("sec:last_at") or 0,
            last_reason = dict:get("sec:last_reason") or "",
            expired = dict:get("sec:expired") or 0,
        },
    }
end

-- encode_status encodes status_doc with the sequence spliced in exactly.
local function encode_status()
    local doc = status_doc()
    doc.sequence = "@@sequence@@"
    local out = cjson.encode(doc)
    return (string.gsub(out, '"@@sequence@@"', seqstr(), 1))
end

-- private() serves the private socket.
function _M.private()
    if authenticate() ~= true then return end
    local method, uri = ngx.req.get_method(), ngx.var.uri
    if uri == "/status" and method == "GET" then
        -- nothing to change
    elseif uri == "/drain" and method == "POST" then
        dict:set("drained", true)
    elseif uri == "/undrain" and method == "POST" then
        dict:set("drained", false)
    elseif string.sub(uri, 1, 6) == "/load/" and method == "POST" then
        local ok, err, kind = load(string.sub(uri, 7))
        if not ok then
            if kind == "failed" then
                dict:incr("load:failures", 1, 0)
                dict:set("load:last_error", err)
                ngx.log(ngx.ERR, "cellvisor: load: ", err, "; still serving ", state.id)
            end
            ngx.status = 409
            ngx.header["Content-Type"] = "application/json"
            ngx.say(cjson.encode({ error = kind, reason = err, release = state.id }))
            return ngx.exit(409)
        end
    elseif uri == "/frontdoor" and method == "GET" then
        -- Resolves ?url= against the org's front doors (lua/frontdoor.lua):
        -- read only, so the query need not be signed.
        local edge, reason, detail = require("frontdoor").resolve(ngx.req.get_uri_args(8).url)
        ngx.header["Content-Type"] = "application/json"
        ngx.say(cjson.encode({ edge = edge, reason = reason, detail = detail }))
        return
    else
        ngx.status = 404
        ngx.say(cjson.encode({ error = "no such call" }))
        return ngx.exit(404)
    end
    ngx.header["Content-Type"] = "application/json"
    ngx.say(encode_status())
end

-- last_value is the last of an upstream variable's values (one per
-- origin server tried, separated by ", " or " : "), nil for "-" or none.
local function last_value(v)
    local last = string.match(v or "", "([^%s,:]+)%s*$")
    if last == "-" then return nil end
    return last
end

-- origin_fault (from log()) is the reason a proxied request's origin
-- failed, with the status to record, or nil when it did not: an answer
-- below 500, or the client's doing (a body over the limit or cut short
-- before any origin was tried, a client gone before the origin answered:
-- "-").
function _M.origin_fault(us)
    us = us or ngx.var.upstream_status or ""
    if us == "" then
        -- No origin server was tried: nginx answers 502 only when the
        -- origin's name did not resolve.
        if ngx.status == 502 then return "resolve", 502 end
        return nil
    end
    local last = tonumber(last_value(us))
    if not last or last < 500 then return nil end
    if last_value(ngx.var.upstream_header_time) then
        return "http_5xx", last -- the origin's own answer
    end
    -- nginx's own 502 or 504: the origin gave no answer it could read.
    local connected = last_value(ngx.var.upstream_connect_time) ~= nil
    if last == 504 then
        return connected and "read_timeout" or "connect_timeout", last
    end
    if not connected then
        return "connect_failed", last -- refused, unreachable, or TLS
    end
    if (tonumber(last_value(ngx.var.upstream_bytes_received)) or 0) > 0 then
        return "bad_answer", last
    end
    return "reset", last
end

-- Request bodies: one budget for the whole cell (limits.request_tmp). A
-- body nginx buffers goes to an unlinked file in tmp/request, where du sees
-- nothing; the per-request limit (client_max_body_size) bounded each, but
-- not their sum. admit_body runs in the access phase, before nginx reads
-- any of the body, and reserves what the body may hold: its declared
-- length, or the whole per-request limit for a chunked one (its length is
-- unknown until it ends). Past the budget the request is refused with 503
-- and counted; log() gives the reservation back when the request ends.
-- Bodies small enough for nginx's memory buffer count too: the budget
-- bounds what the requests in progress may hold, wherever nginx puts it.
local body_held = "body:held"

-- body_key is this worker's share of the reservations, so that what a
-- worker held when it died (killed, out of memory) can be given back.
local function body_key()
    return "body:w:" .. ngx.worker.pid()
end

-- reclaim_bodies gives back the reservations of workers that are gone, at
-- most once a second (it reads every key of the dict), and says whether
-- it gave back any.
local function reclaim_bodies()
    if not dict:add("body:reclaimed", true, 1) then return false end
    local gave = false
    for _, key in ipairs(dict:get_keys(0)) do
        local pid = string.match(key, "^body:w:(%d+)$")
        if pid and tonumber(pid) ~= ngx.worker.pid() then
            local f = io.open("/proc/" .. pid .. "/stat", "rb")
            if f then
                f:close()
            else
                local n = dict:get(key) or 0
                dict:delete(key)
                if n > 0 then
                    dict:incr(body_held, -n, 0)
                    gave = true
                end
            end
        end
    end
    return gave
end

local function reserve_body(n, budget)
    local held, err = dict:incr(body_held, n, 0)
    if not held then
        -- The dict is full: nothing can be counted, so nothing is admitted.
        ngx.log(ngx.ERR, "cellvisor: request body budget: ", err)
        return false
    end
    if held > budget then
        dict:incr(body_held, -n, 0)
        return false
    end
    dict:incr(body_key(), n, 0)
    return true
end

-- admit_body(budget, max): budget is limits.request_tmp, max the
-- per-request limit (client_max_body_size).
function _M.admit_body(budget, max)
    local n = tonumber(ngx.var.http_content_length)
    if not n and ngx.var.http_transfer_encoding then
        n = max
    end
    if not n or n <= 0 then return end
    if not reserve_body(n, budget) and not (reclaim_bodies() and reserve_body(n, budget)) then
        dict:incr("refused:bodies", 1, 0)
        ngx.log(ngx.WARN, "cellvisor: refused a request body of ", n, " bytes: the cell's bodies hold ",
            dict:get(body_held) or 0, " of ", budget)
        return ngx.exit(503)
    end
    ngx.var.cv_body = n
end

-- release_body gives back the request's reservation (from log()).
function _M.release_body()
    local n = tonumber(ngx.var.cv_body)
    if not n or n <= 0 then return end
    ngx.var.cv_body = ""
    dict:incr(body_held, -n, 0)
    dict:incr(body_key(), -n, 0)
end

-- The status document with the disk budgets' figures the cell keeps.
local status_base = status_doc
status_doc = function()
    local doc = status_base()
    doc.bodies = {
        held = dict:get(body_held) or 0,
        refused = dict:get("refused:bodies") or 0,
    }
    return doc
end

return _M
