package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
)

// maxBulk bounds a bulk string a client may send (Redis's
// proto-max-bulk-len is 512 MB; a small server keeps it small).
const maxBulk = 16 << 20

// maxArgs bounds a command's arguments.
const maxArgs = 1 << 16

// errProtocol is a request that is not RESP: the server answers with an
// error and closes the connection, as Redis does.
var errProtocol = errors.New("resp: protocol error")

// store is the server's data: strings and lists, under one lock, and how
// many of each command it ran (what a test checks against what its clients
// sent).
type store struct {
	mu    sync.Mutex
	str   map[string][]byte
	lists map[string]*list
	ran   map[string]uint64
}

func newStore() *store {
	return &store{str: map[string][]byte{}, lists: map[string]*list{}, ran: map[string]uint64{}}
}

// count is how many times the server ran cmd (upper case).
func (s *store) count(cmd string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ran[cmd]
}

// serve answers every connection ln accepts until ln closes; each
// connection's goroutine ends with its connection, which ends when the
// client goes or fails.
func (s *store) serve(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go s.serveConn(c)
	}
}

// serveConn runs c's commands in order, replying to each; replies are
// flushed when no further command is already buffered (pipelining).
func (s *store) serveConn(c net.Conn) error {
	defer c.Close()
	r, w := bufio.NewReaderSize(c, 64<<10), bufio.NewWriterSize(c, 64<<10)
	for {
		args, err := readCommand(r)
		if errors.Is(err, errProtocol) {
			writeError(w, err.Error())
			w.Flush()
			return err
		}
		if err != nil {
			return err // the client went (io.EOF) or the connection failed
		}
		if len(args) == 0 {
			continue
		}
		quit := s.exec(w, args)
		if r.Buffered() == 0 || quit {
			if err := w.Flush(); err != nil {
				return err
			}
		}
		if quit {
			return nil
		}
	}
}

// exec runs one command and writes its reply; it reports QUIT.
func (s *store) exec(w *bufio.Writer, args [][]byte) (quit bool) {
	cmd := strings.ToUpper(string(args[0]))
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ran[cmd]++
	a := args[1:]
	switch {
	case cmd == "PING" && len(a) == 0:
		w.WriteString("+PONG\r\n")
	case (cmd == "PING" || cmd == "ECHO") && len(a) == 1:
		writeBulk(w, a[0])
	case cmd == "SET" && len(a) == 2:
		s.str[string(a[0])] = a[1]
		delete(s.lists, string(a[0]))
		w.WriteString("+OK\r\n")
	case cmd == "MSET" && len(a) > 0 && len(a)%2 == 0:
		for i := 0; i < len(a); i += 2 {
			s.str[string(a[i])] = a[i+1]
			delete(s.lists, string(a[i]))
		}
		w.WriteString("+OK\r\n")
	case cmd == "GET" && len(a) == 1:
		if _, ok := s.lists[string(a[0])]; ok {
			writeError(w, "WRONGTYPE Operation against a key holding the wrong kind of value")
			break
		}
		v, ok := s.str[string(a[0])]
		if !ok {
			w.WriteString("$-1\r\n")
			break
		}
		writeBulk(w, v)
	case cmd == "INCR" && len(a) == 1:
		s.incr(w, string(a[0]))
	case cmd == "DEL" && len(a) > 0:
		n := 0
		for _, k := range a {
			_, ok1 := s.str[string(k)]
			_, ok2 := s.lists[string(k)]
			if ok1 || ok2 {
				n++
			}
			delete(s.str, string(k))
			delete(s.lists, string(k))
		}
		writeInt(w, int64(n))
	case (cmd == "LPUSH" || cmd == "RPUSH") && len(a) > 1:
		s.push(w, cmd == "LPUSH", string(a[0]), a[1:])
	case (cmd == "LPOP" || cmd == "RPOP") && len(a) == 1:
		s.pop(w, cmd == "LPOP", string(a[0]))
	case cmd == "LLEN" && len(a) == 1:
		writeInt(w, int64(s.lists[string(a[0])].len()))
	case cmd == "CONFIG" && len(a) == 2 && strings.EqualFold(string(a[0]), "GET"):
		w.WriteString("*2\r\n") // redis-benchmark asks for save and appendonly: none set
		writeBulk(w, a[1])
		writeBulk(w, nil)
	case cmd == "COMMAND":
		w.WriteString("*0\r\n")
	case cmd == "QUIT":
		w.WriteString("+OK\r\n")
		return true
	default:
		writeError(w, fmt.Sprintf("ERR unknown command or wrong number of arguments for '%s'", args[0]))
	}
	return false
}

// incr adds one to the integer at k; s.mu held.
func (s *store) incr(w *bufio.Writer, k string) {
	v := int64(0)
	if b, ok := s.str[k]; ok {
		var err error
		if v, err = strconv.ParseInt(string(b), 10, 64); err != nil {
			writeError(w, "ERR value is not an integer or out of range")
			return
		}
	}
	v++
	s.str[k] = strconv.AppendInt(nil, v, 10)
	writeInt(w, v)
}

// list is a list as a deque: front holds the head's items in reverse,
// back the rest in order, so pushes and pops at either end are O(1).
type list struct{ front, back [][]byte }

func (l *list) len() int {
	if l == nil {
		return 0
	}
	return len(l.front) + len(l.back)
}

// push adds vals to the list at k, at its head or tail; s.mu held.
func (s *store) push(w *bufio.Writer, head bool, k string, vals [][]byte) {
	if _, ok := s.str[k]; ok {
		writeError(w, "WRONGTYPE Operation against a key holding the wrong kind of value")
		return
	}
	l := s.lists[k]
	if l == nil {
		l = &list{}
		s.lists[k] = l
	}
	if head {
		l.front = append(l.front, vals...)
	} else {
		l.back = append(l.back, vals...)
	}
	writeInt(w, int64(l.len()))
}

// pop takes the head or tail of the list at k; s.mu held.
func (s *store) pop(w *bufio.Writer, head bool, k string) {
	l := s.lists[k]
	if l.len() == 0 {
		w.WriteString("$-1\r\n")
		return
	}
	var v []byte
	switch {
	case head && len(l.front) > 0:
		v, l.front = l.front[len(l.front)-1], l.front[:len(l.front)-1]
	case head:
		v, l.back = l.back[0], l.back[1:]
	case len(l.back) > 0:
		v, l.back = l.back[len(l.back)-1], l.back[:len(l.back)-1]
	default:
		v, l.front = l.front[0], l.front[1:]
	}
	if l.len() == 0 {
		delete(s.lists, k)
	}
	writeBulk(w, v)
}

// readCommand reads one request: an array of bulk strings, or an inline
// command (words on a line, as redis-benchmark's PING_INLINE sends).
func readCommand(r *bufio.Reader) ([][]byte, error) {
	line, err := readLine(r)
	if err != nil {
		return nil, err
	}
	if len(line) == 0 || line[0] != '*' {
		var args [][]byte
		for _, f := range strings.Fields(string(line)) {
			args = append(args, []byte(f))
		}
		return args, nil
	}
	n, err := strconv.Atoi(string(line[1:]))
	if err != nil || n > maxArgs {
		return nil, fmt.Errorf("%w: array header %q", errProtocol, line)
	}
	args := make([][]byte, 0, max(n, 0))
	for range n {
		b, err := readBulk(r)
		if err != nil {
			return nil, err
		}
		if b == nil {
			return nil, fmt.Errorf("%w: a null bulk string in a command", errProtocol)
		}
		args = append(args, b)
	}
	return args, nil
}

// readLine reads a line ending in CRLF (or LF), without it.
func readLine(r *bufio.Reader) ([]byte, error) {
	line, err := r.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		return nil, fmt.Errorf("%w: a line longer than %d bytes", errProtocol, r.Size())
	}
	if err != nil {
		if err == io.EOF && len(line) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return append([]byte(nil), line...), nil
}

// readBulk reads a bulk string ($len CRLF bytes CRLF); nil for $-1.
func readBulk(r *bufio.Reader) ([]byte, error) {
	line, err := readLine(r)
	if err != nil {
		return nil, err
	}
	if len(line) == 0 || line[0] != '$' {
		return nil, fmt.Errorf("%w: want a bulk string, got %q", errProtocol, line)
	}
	n, err := strconv.Atoi(string(line[1:]))
	switch {
	case err != nil || n < -1 || n > maxBulk:
		return nil, fmt.Errorf("%w: bulk length %q", errProtocol, line[1:])
	case n == -1:
		return nil, nil
	}
	b := make([]byte, n+2)
	if _, err := io.ReadFull(r, b); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	if b[n] != '\r' || b[n+1] != '\n' {
		return nil, fmt.Errorf("%w: a bulk string of %d bytes without its CRLF", errProtocol, n)
	}
	return b[:n], nil
}

func writeBulk(w *bufio.Writer, b []byte) {
	w.WriteString("$")
	w.WriteString(strconv.Itoa(len(b)))
	w.WriteString("\r\n")
	w.Write(b)
	w.WriteString("\r\n")
}

func writeInt(w *bufio.Writer, v int64) {
	w.WriteString(":")
	w.WriteString(strconv.FormatInt(v, 10))
	w.WriteString("\r\n")
}

func writeError(w *bufio.Writer, msg string) {
	w.WriteString("-")
	w.WriteString(strings.NewReplacer("\r", " ", "\n", " ").Replace(msg))
	w.WriteString("\r\n")
}

// reply is a RESP reply as the client reads it.
type reply struct {
	kind  byte   // '+', '-', ':', '$' or '*'
	str   []byte // simple string, error text or bulk string (nil: null)
	n     int64  // integer, or the array's length
	elems []reply
}

// respClient is a Go RESP client: commands and their replies, in order, on one
// connection (pipelined when sent with send, then read with recv).
type respClient struct {
	c net.Conn
	r *bufio.Reader
	w *bufio.Writer
}

func newClient(c net.Conn) *respClient {
	return &respClient{c: c, r: bufio.NewReaderSize(c, 64<<10), w: bufio.NewWriterSize(c, 64<<10)}
}

// send writes one command as an array of bulk strings (buffered: flush
// sends it).
func (cl *respClient) send(args ...[]byte) {
	cl.w.WriteString("*")
	cl.w.WriteString(strconv.Itoa(len(args)))
	cl.w.WriteString("\r\n")
	for _, a := range args {
		writeBulk(cl.w, a)
	}
}

func (cl *respClient) flush() error { return cl.w.Flush() }

// recv reads one reply.
func (cl *respClient) recv() (reply, error) { return readReply(cl.r) }

// do sends one command and reads its reply.
func (cl *respClient) do(args ...string) (reply, error) {
	b := make([][]byte, len(args))
	for i, a := range args {
		b[i] = []byte(a)
	}
	cl.send(b...)
	if err := cl.flush(); err != nil {
		return reply{}, err
	}
	return cl.recv()
}

func readReply(r *bufio.Reader) (reply, error) {
	b, err := r.Peek(1)
	if err != nil {
		return reply{}, err
	}
	switch b[0] {
	case '$':
		s, err := readBulk(r)
		return reply{kind: '$', str: s}, err
	case '+', '-', ':', '*':
	default:
		return reply{}, fmt.Errorf("%w: a reply starting %q", errProtocol, b[0])
	}
	line, err := readLine(r)
	if err != nil {
		return reply{}, err
	}
	rp := reply{kind: line[0], str: line[1:]}
	if rp.kind == ':' || rp.kind == '*' {
		if rp.n, err = strconv.ParseInt(string(line[1:]), 10, 64); err != nil || rp.n > maxArgs {
			return reply{}, fmt.Errorf("%w: %q", errProtocol, line)
		}
	}
	for i := int64(0); rp.kind == '*' && i < rp.n; i++ {
		e, err := readReply(r)
		if err != nil {
			return reply{}, err
		}
		rp.elems = append(rp.elems, e)
	}
	return rp, nil
}

// String prints a reply as redis-cli would, roughly.
func (rp reply) String() string {
	switch rp.kind {
	case ':':
		return fmt.Sprintf("(integer) %d", rp.n)
	case '-':
		return "(error) " + string(rp.str)
	case '$':
		if rp.str == nil {
			return "(nil)"
		}
	}
	return fmt.Sprintf("%q", rp.str)
}
