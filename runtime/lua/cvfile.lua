-- cellvisor cell runtime: reading the agent's files.
--
-- A file is read through the C library: opened without blocking, so that
-- a FIFO put in its place (or a link to one) is refused at once rather
-- than holding the worker until a writer comes, and accepted only when it
-- can seek (a regular file: a FIFO or socket cannot, a device reads as
-- empty). Lua's io.open cannot open without blocking.
local ffi = require "ffi"
local bit = require "bit"

local _M = {}

pcall(ffi.cdef, [[
int open(const char *pathname, int flags, ...);
int close(int fd);
long lseek(int fd, long offset, int whence);
long read(int fd, void *buf, unsigned long count);
]]) -- declared once per Lua state; a second cdef of the same would fail
local O_RDONLY, O_NONBLOCK, O_CLOEXEC = 0, 0x800, 0x80000
local SEEK_SET, SEEK_END = 0, 2

-- read reads the whole of path, at most max bytes, or answers nil and why
-- (what names the file in the reason).
function _M.read(path, max, what)
    local fd = ffi.C.open(path, bit.bor(O_RDONLY, O_NONBLOCK, O_CLOEXEC))
    if fd < 0 then return nil, what .. ": cannot open (errno " .. ffi.errno() .. ")" end
    local size = tonumber(ffi.C.lseek(fd, 0, SEEK_END))
    if size < 0 then
        ffi.C.close(fd)
        return nil, what .. " is not a regular file"
    end
    if size > max then
        ffi.C.close(fd)
        return nil, string.format("%s is too large (%d bytes, at most %d)", what, size, max)
    end
    ffi.C.lseek(fd, 0, SEEK_SET)
    local buf = ffi.new("char[?]", size + 1)
    local got = 0
    while got <= size do
        local n = tonumber(ffi.C.read(fd, buf + got, size + 1 - got))
        if n < 0 then ffi.C.close(fd); return nil, what .. ": read failed (errno " .. ffi.errno() .. ")" end
        if n == 0 then break end
        got = got + n
    end
    ffi.C.close(fd)
    -- Grown since the seek: read again next time.
    if got > size then return nil, what .. " is being replaced" end
    return ffi.string(buf, got)
end

return _M
