-- cellvisor cell runtime: routes requests by Host to the pool's domains.
-- Loaded in the master by init_by_lua from the active release; the pool JSON
-- is read once per (re)load, so a reload picks up a switched release.
local cjson = require "cjson.safe"

local _M = { hosts = {}, cell = "?", pool = "", sequence = 0 }

local function read_file(path)
    local f, err = io.open(path, "rb")
    if not f then return nil, err end
    local data = f:read("*a")
    f:close()
    return data
end

function _M.init(opts)
    _M.cell, _M.pool, _M.sequence = opts.cell, opts.pool or "", opts.sequence or 0
    if _M.pool == "" then return end
    local data, err = read_file(opts.pools_dir .. "/" .. _M.pool .. ".json")
    if not data then
        error("cellvisor: read pool runtime: " .. tostring(err))
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
    ngx.header["Content-Type"] = "text/plain"
    ngx.say("ready ", _M.cell, " sequence ", _M.sequence)
end

function _M.serve()
    local d = lookup(ngx.var.host)
    if not d then
        ngx.status = 404
        ngx.header["Content-Type"] = "text/plain"
        ngx.say("no such domain on ", _M.cell)
        return ngx.exit(404)
    end
    local uri = ngx.var.uri
    local best
    for _, r in ipairs(d.routes or {}) do
        if string.sub(uri, 1, #r.prefix) == r.prefix and (not best or #r.prefix > #best.prefix) then
            best = r
        end
    end
    if not best then
        ngx.status = 404
        ngx.say("no route")
        return ngx.exit(404)
    end
    ngx.header["X-Cellvisor-Cell"] = _M.cell
    if best.respond then
        ngx.status = best.respond.status
        ngx.header["Content-Type"] = best.respond.content_type or "text/plain"
        ngx.print(best.respond.body)
        return ngx.exit(ngx.status)
    end
    for _, o in ipairs(d.origins or {}) do
        if o.name == best.origin then
            ngx.var.cv_origin = o.url
            return ngx.exec("@origin")
        end
    end
    return ngx.exit(502)
end

return _M
