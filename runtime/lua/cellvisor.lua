-- cellvisor cell runtime.
--
-- Public side: routes requests by Host to the pool's domains, answers the
-- readiness probe (503 while drained), counts requests and records
-- passive-origin failures.
-- Private side (unix socket only): GET /status, POST /drain, POST /undrain,
-- GET /frontdoor?url=U (the org's front door for U, or the refusal), each
-- authenticated with the cell's secret (see auth below).
--
-- init() runs in the master on every (re)load: the pool JSON and the secret
-- are read once per load; the shared dict (drained flag, counters, nonces)
-- survives reloads.
local cjson = require "cjson.safe"
local bit = require "bit"

local dict = ngx.shared.cellvisor

local _M = { hosts = {}, cell = "?", pool = "", sequence = 0, secret = nil,
    limits = { max_conns = 0, rate = 0, burst = 0 } }

-- A request is accepted only within auth_window seconds of its timestamp
-- (init's opts.auth_window, 30 by default), and each nonce only once: a
-- nonce is remembered until its timestamp has left the window, so a proof
-- dated ahead of the cell's clock cannot be accepted again once its nonce
-- is forgotten.
local auth_window = 30

-- seqstr renders the sequence as the exact integer it is: tostring and
-- cjson (14 significant digits by default) would round one over 10^14 into
-- an exponent the agent cannot decode as an integer.
local function seqstr()
    return string.format("%.0f", _M.sequence)
end

local function read_file(path)
    local f, err = io.open(path, "rb")
    if not f then return nil, err end
    local data = f:read("*a")
    f:close()
    return data
end

function _M.init(opts)
    _M.cell, _M.pool, _M.sequence = opts.cell, opts.pool or "", opts.sequence or 0
    auth_window = tonumber(opts.auth_window) or 30
    _M.expose_cell = opts.expose_cell == true
    _M.limits = opts.limits or _M.limits
    -- Sequences are 1 … 2^53-1, exact in a double; anything else is not
    -- one the agent wrote, and is reported as 0 rather than rounded.
    if type(_M.sequence) ~= "number" or _M.sequence < 0 or _M.sequence > 9007199254740991
        or _M.sequence ~= math.floor(_M.sequence) then
        _M.sequence = 0
    end
    local secret, err = read_file(opts.secret_file)
    if not secret or #secret < 32 then
        error("cellvisor: read cell secret " .. tostring(opts.secret_file) .. ": " .. tostring(err or "too short"))
    end
    _M.secret = secret:gsub("%s+$", "")
    -- The agent's persisted drained state seeds the flag on a fresh start; a
    -- reload keeps the flag the private endpoint last set (add() does not
    -- overwrite).
    dict:add("drained", read_file(opts.drained_file) ~= nil)
    if _M.pool == "" then return end
    local data, rerr = read_file(opts.pools_dir .. "/" .. _M.pool .. ".json")
    if not data then
        error("cellvisor: read pool runtime: " .. tostring(rerr))
    end
    local rt, derr = cjson.decode(data)
    if not rt then
        error("cellvisor: decode pool runtime: " .. tostring(derr))
    end
    _M.hosts = rt.hosts or {}
end

local function lookup(host)
    host = string.lower(host or "")
    local d = _M.hosts[host]
    if d then return d end
    local dot = string.find(host, ".", 1, true)
    if dot then return _M.hosts["*" .. string.sub(host, dot)] end
end

function _M.ready()
    ngx.ctx.probe = true -- not counted as a request served
    ngx.header["Content-Type"] = "text/plain"
    if dict:get("drained") then
        ngx.status = 503
        ngx.say("draining ", _M.cell)
        return ngx.exit(503)
    end
    ngx.say("ready ", _M.cell, " sequence ", seqstr())
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

-- answer ends the request with a plain-text answer the cell makes itself.
local function answer(status, text)
    ngx.status = status
    ngx.header["Content-Type"] = "text/plain"
    ngx.say(text)
    return ngx.exit(status)
end

-- cache_headers runs in the header filter of cached routes: an answer
-- with private, no-store or no-cache in any of its Cache-Control lines is
-- not stored (nginx's own check reads only the first line).
-- headers clears what would name the server to the public: nginx's
-- Server header (server_tokens off still sends "nginx").
function _M.headers()
    ngx.header["Server"] = nil
end

function _M.cache_headers()
    _M.headers() -- this location's filter replaces the server's
    local cc = ngx.resp.get_headers(100)["Cache-Control"]
    if type(cc) == "table" then
        cc = table.concat(cc, ",")
    end
    if type(cc) ~= "string" then
        return
    end
    cc = string.lower(cc)
    if string.find(cc, "private", 1, true) or string.find(cc, "no-store", 1, true)
        or string.find(cc, "no-cache", 1, true) then
        ngx.var.cv_private = "1"
    end
end

function _M.serve()
    local d = lookup(ngx.var.host)
    if not d then
        return answer(404, "no such domain")
    end
    local uri = normalize(ngx.var.uri)
    if not uri then
        return answer(400, "ambiguous path")
    end
    local best
    for _, r in ipairs(d.routes or {}) do
        if string.sub(uri, 1, #r.prefix) == r.prefix and (not best or #r.prefix > #best.prefix) then
            best = r
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
        return ngx.exit(ngx.status)
    end
    for _, o in ipairs(d.origins or {}) do
        if o.name == best.origin then
            ngx.var.cv_origin = o.url
            ngx.var.cv_origin_name = d.domain .. "/" .. o.name
            ngx.var.cv_path = escape_path(uri)
            -- A domain with a cache TTL goes through the cached location of
            -- its TTL, which the release rendered from the same pool JSON.
            local ttl = type(d.cache) == "table" and tonumber(d.cache.ttl_seconds) or 0
            if ttl and ttl > 0 then
                return ngx.exec("@origin_ttl_" .. string.format("%d", ttl))
            end
            return ngx.exec("@origin")
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
    if ngx.ctx.probe then return end
    dict:incr("requests", 1, 0)
    if ngx.var.limit_conn_status == "REJECTED" then
        dict:incr("refused:connections", 1, 0)
        return
    end
    if ngx.var.limit_req_status == "REJECTED" then
        dict:incr("refused:rate", 1, 0)
        return
    end
    local origin = ngx.var.cv_origin_name
    if origin == nil or origin == "" then return end
    local cs = ngx.var.upstream_cache_status
    if cs and cs ~= "" then
        dict:incr("cache:" .. string.lower(cs), 1, 0)
        if served_from_cache[cs] then return end
    end
    local reason, status = _M.origin_fault()
    if not reason then return end
    local key = "origin:" .. origin
    local rec = cjson.decode(dict:get(key) or "{}") or {}
    rec.failures = (rec.failures or 0) + 1
    rec.last_failure_at = ngx.now()
    rec.last_status = status
    rec.last_reason = reason
    if type(rec.reasons) ~= "table" then rec.reasons = {} end
    rec.reasons[reason] = (rec.reasons[reason] or 0) + 1
    dict:set(key, cjson.encode(rec))
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

local function status_doc()
    return {
        cell = _M.cell,
        pool = _M.pool,
        sequence = _M.sequence,
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
        },
        origins = origins(),
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
function _M.origin_fault()
    local us = ngx.var.upstream_status or ""
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
