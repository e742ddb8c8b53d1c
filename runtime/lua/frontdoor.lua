-- cellvisor front-door resolver: the Lua twin of the Go package frontdoor,
-- authored decision for decision (see frontdoor/normalize.go and
-- resolve.go) and pinned to it by frontdoor/testdata/cases.json, which
-- runtime/frontdoor_lua_test.go runs through this file in a real nginx.
--
-- resolve(url) answers (edge, nil) or (nil, reason, detail), reason one of
-- "unmapped", "ambiguous", "corrupt_row", "malformed". Never a guess.
--
-- Rows come from the runtime file the agent writes (init{rows_file=...}):
-- {"rows":[{"edge":..,"url":..}]}; it is read on every resolve and its
-- rows prepared once per content. An unreadable or undecodable file (a
-- FIFO, a directory, over 4 MiB) refuses every resolve as corrupt_row.
--
-- IDNA: a non-ASCII label is Punycode-encoded to its A-label and an
-- "xn--" label is decoded, re-encoded and must round-trip. The Go side
-- checks code points against the IDNA2008 tables; Lua refuses only the
-- ranges it can name (the Latin-1 code points Go refuses, exactly;
-- specials and noncharacters).
-- Where the two could differ the Lua answer can only be another refusal
-- (malformed or unmapped), never an edge: every row is canonical by the Go
-- rules (the control API stores only those, the agent re-checks them).
local _M = {}

local MAX_URL_LEN = 2048
local MAX_HOST_LEN = 253
local MAX_LABEL_LEN = 63
local MAX_EDGE_LEN = 64

local byte, sub, find, lower = string.byte, string.sub, string.find, string.lower
local floor = math.floor

local Malformed = "malformed"

-- utf8 decodes s into code points, or nil if s is not valid UTF-8
-- (overlong forms, surrogates and values over U+10FFFF are refused, as
-- Go's utf8.ValidString does).
local function utf8_decode(s)
    local cps, i, n = {}, 1, #s
    while i <= n do
        local c = byte(s, i)
        local cp, len, min
        if c < 0x80 then cp, len, min = c, 1, 0
        elseif c >= 0xC2 and c <= 0xDF then cp, len, min = c - 0xC0, 2, 0x80
        elseif c >= 0xE0 and c <= 0xEF then cp, len, min = c - 0xE0, 3, 0x800
        elseif c >= 0xF0 and c <= 0xF4 then cp, len, min = c - 0xF0, 4, 0x10000
        else return nil end
        if i + len - 1 > n then return nil end
        for j = i + 1, i + len - 1 do
            local cc = byte(s, j)
            if cc < 0x80 or cc > 0xBF then return nil end
            cp = cp * 64 + (cc - 0x80)
        end
        if cp < min or cp > 0x10FFFF or (cp >= 0xD800 and cp <= 0xDFFF) then return nil end
        cps[#cps + 1] = cp
        i = i + len
    end
    return cps
end

-- Punycode (RFC 3492).
local BASE, TMIN, TMAX, SKEW, DAMP, IBIAS, INITIAL_N = 36, 1, 26, 38, 700, 72, 128

local function adapt(delta, numpoints, first)
    delta = first and floor(delta / DAMP) or floor(delta / 2)
    delta = delta + floor(delta / numpoints)
    local k = 0
    while delta > floor(((BASE - TMIN) * TMAX) / 2) do
        delta = floor(delta / (BASE - TMIN))
        k = k + BASE
    end
    return k + floor(((BASE - TMIN + 1) * delta) / (delta + SKEW))
end

local function digit_char(d)
    if d < 26 then return string.char(97 + d) end
    return string.char(22 + d) -- '0' + d - 26
end

local function char_digit(c)
    if c >= 48 and c <= 57 then return c - 22 end
    if c >= 97 and c <= 122 then return c - 97 end
    return nil
end

local function puny_encode(cps)
    local out, n, delta, bias = {}, INITIAL_N, 0, IBIAS
    for _, cp in ipairs(cps) do
        if cp < 0x80 then out[#out + 1] = string.char(cp) end
    end
    local b = #out
    local h = b
    if b > 0 then out[#out + 1] = "-" end
    while h < #cps do
        local m = 0x7FFFFFFF
        for _, cp in ipairs(cps) do
            if cp >= n and cp < m then m = cp end
        end
        delta = delta + (m - n) * (h + 1)
        n = m
        for _, cp in ipairs(cps) do
            if cp < n then delta = delta + 1 end
            if cp == n then
                local q, k = delta, BASE
                while true do
                    local t = k <= bias and TMIN or (k >= bias + TMAX and TMAX or k - bias)
                    if q < t then break end
                    out[#out + 1] = digit_char(t + (q - t) % (BASE - t))
                    q = floor((q - t) / (BASE - t))
                    k = k + BASE
                end
                out[#out + 1] = digit_char(q)
                bias = adapt(delta, h + 1, h == b)
                delta = 0
                h = h + 1
            end
        end
        delta = delta + 1
        n = n + 1
    end
    return table.concat(out)
end

local function puny_decode(s)
    local cps, n, i, bias = {}, INITIAL_N, 0, IBIAS
    local b = 0
    for j = #s, 1, -1 do
        if byte(s, j) == 45 then b = j; break end
    end
    for j = 1, b - 1 do
        local c = byte(s, j)
        if c >= 0x80 then return nil end
        cps[#cps + 1] = c
    end
    local pos = b + 1
    while pos <= #s do
        local oldi, w, k = i, 1, BASE
        while true do
            if pos > #s then return nil end
            local d = char_digit(byte(s, pos))
            pos = pos + 1
            if not d then return nil end
            i = i + d * w
            if i > 0x7FFFFFFF then return nil end
            local t = k <= bias and TMIN or (k >= bias + TMAX and TMAX or k - bias)
            if d < t then break end
            w = w * (BASE - t)
            k = k + BASE
        end
        local len = #cps + 1
        bias = adapt(i - oldi, len, oldi == 0)
        n = n + floor(i / len)
        i = i % len
        if n > 0x10FFFF then return nil end
        table.insert(cps, i + 1, n)
        i = i + 1
    end
    return cps
end

-- latin1_refused are the Latin-1 code points (U+0080-U+00FF) that Go's
-- profile refuses, exactly: the C1 controls and no-break space, and those
-- it maps (diaeresis, ordinals, soft hyphen, macron, superscripts, acute,
-- micro, cedilla, fractions, upper-case letters). It allows the others,
-- symbols among them (U+00A1 ¡, U+00B7 · of "l·l", U+00D7 ×, U+00F7 ÷),
-- and a row may hold them.
local latin1_refused = {}
for cp = 0x80, 0xA0 do latin1_refused[cp] = true end
for _, cp in ipairs({ 0xA8, 0xAA, 0xAD, 0xAF, 0xB2, 0xB3, 0xB4, 0xB5, 0xB8, 0xB9, 0xBA, 0xBC, 0xBD, 0xBE }) do
    latin1_refused[cp] = true
end
for cp = 0xC0, 0xDE do
    if cp ~= 0xD7 then latin1_refused[cp] = true end
end

-- ulabel_ok checks the code points of a U-label: ASCII only a-z, 0-9 and
-- '-'; no Latin-1 code point Go refuses; no surrogate (utf8_decode
-- refuses those).
local function ulabel_ok(cps)
    local nonascii = false
    for _, cp in ipairs(cps) do
        if cp < 0x80 then
            if not ((cp >= 97 and cp <= 122) or (cp >= 48 and cp <= 57) or cp == 45) then return false end
        else
            nonascii = true
            if latin1_refused[cp] then return false end
            -- Specials (U+FFF0-U+FFFF, the replacement character among
            -- them) and the noncharacters U+FDD0-U+FDEF.
            if (cp >= 0xFFF0 and cp <= 0xFFFF) or (cp >= 0xFDD0 and cp <= 0xFDEF) then return false end
        end
    end
    return nonascii
end

local function to_alabel(label)
    local ascii = not find(label, "[\128-\255]")
    if ascii then
        if sub(label, 1, 4) == "xn--" then
            local cps = puny_decode(sub(label, 5))
            if not cps or #cps == 0 or not ulabel_ok(cps) then return nil end
            if "xn--" .. puny_encode(cps) ~= label then return nil end
        end
        return label
    end
    local cps = utf8_decode(label)
    if not cps or not ulabel_ok(cps) then return nil end
    return "xn--" .. puny_encode(cps)
end

local function check_label(l)
    if #l == 0 or #l > MAX_LABEL_LEN then return false end
    if byte(l, 1) == 45 or byte(l, #l) == 45 then return false end
    if find(l, "[^a-z0-9%-]") then return false end
    -- Hyphens in the 3rd and 4th positions are reserved for A-labels.
    if sub(l, 3, 4) == "--" and sub(l, 1, 4) ~= "xn--" then return false end
    return true
end

local function normalize_host(h)
    if sub(h, 1, 1) == "[" or find(h, ":", 1, true) then return nil, "host is an IP literal" end
    if sub(h, -1) == "." then h = sub(h, 1, -2) end
    if h == "" then return nil, "host is empty" end
    if find(h, "%", 1, true) then return nil, "host is percent-encoded" end
    h = h:gsub("[A-Z]", lower)
    local labels, start = {}, 1
    while true do
        local dot = find(h, ".", start, true)
        local l = sub(h, start, dot and dot - 1 or #h)
        local a = to_alabel(l)
        if not a or not check_label(a) then return nil, "label is not a valid IDNA2008 label" end
        labels[#labels + 1] = a
        if not dot then break end
        start = dot + 1
    end
    local out = table.concat(labels, ".")
    if #out > MAX_HOST_LEN then return nil, "host is too long" end
    if find(labels[#labels], "^[0-9]+$") then return nil, "host ends in a numeric label" end
    return out
end

-- normalize returns the canonical origin "scheme://host:port" of raw, or
-- nil and a detail (the input is malformed).
function _M.normalize(raw)
    if type(raw) ~= "string" then return nil, "url is not a string" end
    if #raw > MAX_URL_LEN then return nil, "url is too long" end
    if not utf8_decode(raw) then return nil, "url is not valid UTF-8" end
    if find(raw, "[%z\1-\32\127\\]") then return nil, "url has a control, space or backslash character" end
    local sep = find(raw, "://", 1, true)
    if not sep then return nil, "url has no scheme://" end
    local scheme = lower(sub(raw, 1, sep - 1))
    local defport
    if scheme == "http" then defport = 80
    elseif scheme == "https" then defport = 443
    else return nil, "scheme is not http or https" end
    local rest = sub(raw, sep + 3)
    local cut = find(rest, "[/?#]")
    if cut then rest = sub(rest, 1, cut - 1) end
    if find(rest, "@", 1, true) then return nil, "url carries userinfo" end
    local hostport, port = rest, defport
    local colon = find(rest, ":[^:]*$")
    if colon then
        local p = sub(rest, colon + 1)
        if #p == 0 or #p > 5 or find(p, "[^0-9]") then return nil, "port is not 1-65535" end
        port = tonumber(p)
        if port < 1 or port > 65535 then return nil, "port is not 1-65535" end
        hostport = sub(rest, 1, colon - 1)
    end
    local host, err = normalize_host(hostport)
    if not host then return nil, err end
    return scheme .. "://" .. host .. ":" .. string.format("%d", port)
end

local function valid_edge(id)
    return type(id) == "string" and #id >= 1 and #id <= MAX_EDGE_LEN and not find(id, "[^a-zA-Z0-9_.%-]")
end

local function check_row(r)
    if type(r) ~= "table" or not valid_edge(r.edge) then return false end
    return type(r.url) == "string" and _M.normalize(r.url) == r.url
end

-- prepare checks rows once and indexes them by URL, as Go's NewTable:
-- { corrupt = detail or nil, by_url = { [url] = { edge, ... } } }.
function _M.prepare(rows)
    local t = { by_url = {} }
    if type(rows) ~= "table" then t.corrupt = "rows are not a list"; return t end
    for i, r in ipairs(rows) do
        if not check_row(r) then t.corrupt = "row " .. i .. " is corrupt"; return t end
        local list = t.by_url[r.url]
        if not list then list = {}; t.by_url[r.url] = list end
        list[#list + 1] = r.edge
    end
    return t
end

-- resolve_in runs the cascade against a prepared table: malformed,
-- corrupt_row, unmapped, ambiguous, or the edge.
function _M.resolve_in(raw, t)
    local want, err = _M.normalize(raw)
    if not want then return nil, Malformed, err end
    if t.corrupt then return nil, "corrupt_row", t.corrupt end
    local edges = t.by_url[want]
    if not edges then return nil, "unmapped", want .. " is no front door" end
    if #edges > 1 then return nil, "ambiguous", want .. " is the front door of " .. #edges .. " rows" end
    return edges[1]
end

-- decide runs the cascade over rows (a list of {edge=, url=}), as Go's
-- frontdoor.Resolve.
function _M.decide(raw, rows)
    return _M.resolve_in(raw, _M.prepare(rows))
end

-- The runtime file, cached by size and modification time.
-- cached_table is the file's rows, prepared once per content.
local rows_file, cached_table, cached_key, cached_err

function _M.init(opts)
    rows_file = opts and opts.rows_file
    cached_table, cached_key, cached_err = nil, nil, nil
end

local MAX_FILE = 4 * 1024 * 1024

-- read_file reads the whole runtime file, at most MAX_FILE bytes, without
-- blocking on a FIFO put in its place (lua/cvfile.lua), or answers nil and
-- why.
local function read_file(path)
    return require("cvfile").read(path, MAX_FILE, "front-door file")
end

local function load_rows()
    if not rows_file then return nil, "no front-door file configured" end
    local data, err = read_file(rows_file)
    if not data then return nil, err end
    local key = ngx.sha1_bin(data)
    if key == cached_key then return cached_table, cached_err end
    local doc = require("cjson.safe").decode(data)
    if type(doc) ~= "table" or type(doc.rows) ~= "table" then
        cached_key, cached_table, cached_err = key, nil, "front-door file does not decode"
    else
        cached_key, cached_table, cached_err = key, _M.prepare(doc.rows), nil
    end
    return cached_table, cached_err
end

-- resolve answers the edge for url from the agent's runtime file. A file
-- that cannot be read or decoded refuses every well-formed URL as
-- corrupt_row.
function _M.resolve(url)
    local t, err = load_rows()
    if not t then t = { by_url = {}, corrupt = err } end
    return _M.resolve_in(url, t)
end

return _M
