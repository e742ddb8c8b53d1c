package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// The demo's story goes to stdout; the logs of the control API and of both
// agents go to files in DIR/logs, started anew by every run and kept after
// it. With --verbose each log line is copied to stderr as well, interleaved
// with the story as it is written.
const (
	logsDir       = "logs"
	controlLog    = "control-api.log"
	agentLog      = "demo-edge.log"
	edge2AgentLog = "demo-edge-2.log"
	// tailEvery is how often --verbose looks for new log lines.
	tailEvery = 50 * time.Millisecond
)

// demoLogs are the log files of one demo run.
type demoLogs struct {
	dir   string
	tee   io.Writer // stderr with --verbose, else nil
	teeMu sync.Mutex
	files []*os.File
	stop  chan struct{}
	wg    sync.WaitGroup
}

func openLogs(root string, verbose bool, stderr io.Writer) (*demoLogs, error) {
	l := &demoLogs{dir: filepath.Join(root, logsDir), stop: make(chan struct{})}
	if verbose {
		l.tee = stderr
	}
	return l, os.MkdirAll(l.dir, 0o755)
}

// file creates (or empties) the log file name. An agent gets the *os.File
// itself, not a pipe: an agent whose demo was killed still stops its cells,
// and logs while it does; a pipe without its reader would end it (SIGPIPE).
func (l *demoLogs) file(name string) (*os.File, error) {
	path := filepath.Join(l.dir, name)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	l.files = append(l.files, f)
	if l.tee != nil {
		r, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		l.wg.Add(1)
		go l.tail(r)
	}
	return f, nil
}

// tail copies what is written to r's file to the tee, whole lines at a
// time, until close; then what is left.
func (l *demoLogs) tail(r *os.File) {
	defer l.wg.Done()
	defer r.Close()
	var pending []byte
	buf := make([]byte, 64<<10)
	t := time.NewTicker(tailEvery)
	defer t.Stop()
	for {
		n, err := r.Read(buf)
		pending = append(pending, buf[:n]...)
		if i := bytes.LastIndexByte(pending, '\n'); i >= 0 {
			l.write(pending[:i+1])
			pending = append(pending[:0], pending[i+1:]...)
		}
		if err == nil {
			continue
		}
		if !errors.Is(err, io.EOF) {
			return
		}
		select {
		case <-l.stop:
			l.write(pending)
			return
		case <-t.C:
		}
	}
}

func (l *demoLogs) write(b []byte) {
	if len(b) == 0 {
		return
	}
	l.teeMu.Lock()
	defer l.teeMu.Unlock()
	_, _ = l.tee.Write(b)
}

// close copies the last lines (--verbose) and closes the files.
func (l *demoLogs) close() {
	close(l.stop)
	l.wg.Wait()
	for _, f := range l.files {
		_ = f.Close()
	}
}

// where is the line that tells the user where the logs are.
func (l *demoLogs) where() string {
	return "logs of the control API and of both agents: " + shortPath(l.dir) + "/ (" +
		controlLog + ", " + agentLog + ", " + edge2AgentLog + "; --verbose prints them here too)"
}

// fileLogger is the control API's console logger, writing to w, without
// colour codes (a file is no terminal).
func fileLogger(w io.Writer) *zap.Logger {
	ec := zap.NewDevelopmentEncoderConfig()
	ec.EncodeLevel = zapcore.CapitalLevelEncoder
	return zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(ec), zapcore.AddSync(w), zap.InfoLevel), zap.AddCaller())
}
