package main

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// pipeClient serves a new store on one end of a pipe and returns a client
// on the other, and serveConn's result.
func pipeClient(t *testing.T) (*store, *respClient, net.Conn, chan error) {
	a, b := net.Pipe()
	s := newStore()
	done := make(chan error, 1)
	go func() { done <- s.serveConn(a) }()
	t.Cleanup(func() { b.Close() })
	b.SetDeadline(time.Now().Add(10 * time.Second))
	return s, newClient(b), b, done
}

// TestCommands: each command's replies as Redis gives them, lists from
// both ends, inline commands, and the errors for wrong types, unknown
// commands and wrong arities (the connection stays usable after them).
func TestCommands(t *testing.T) {
	s, cl, raw, _ := pipeClient(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"PING"}, `"PONG"`}, {[]string{"ECHO", "hi"}, `"hi"`},
		{[]string{"GET", "k"}, "(nil)"}, {[]string{"SET", "k", "v"}, `"OK"`}, {[]string{"GET", "k"}, `"v"`},
		{[]string{"INCR", "k"}, "(error) ERR value is not an integer or out of range"},
		{[]string{"INCR", "n"}, "(integer) 1"}, {[]string{"INCR", "n"}, "(integer) 2"},
		{[]string{"RPUSH", "l", "b", "c"}, "(integer) 2"}, {[]string{"LPUSH", "l", "a"}, "(integer) 3"},
		{[]string{"LPOP", "l"}, `"a"`}, {[]string{"LPOP", "l"}, `"b"`}, {[]string{"LPUSH", "l", "z"}, "(integer) 2"},
		{[]string{"RPOP", "l"}, `"c"`}, {[]string{"RPOP", "l"}, `"z"`}, {[]string{"RPOP", "l"}, "(nil)"},
		{[]string{"LPUSH", "k", "x"}, "(error) WRONGTYPE Operation against a key holding the wrong kind of value"},
		{[]string{"MSET", "a", "1", "b", "2"}, `"OK"`}, {[]string{"DEL", "a", "b", "nope"}, "(integer) 2"},
		{[]string{"SET", "k"}, "(error) ERR unknown command or wrong number of arguments for 'SET'"},
		{[]string{"FLY"}, "(error) ERR unknown command or wrong number of arguments for 'FLY'"},
	} {
		rp, err := cl.do(c.args...)
		expectReply(t, c.args[0], rp, err, c.want)
	}
	raw.Write([]byte("PING\r\n")) // inline, as redis-benchmark's PING_INLINE
	rp, err := cl.recv()
	expectReply(t, "inline PING", rp, err, `"PONG"`)
	if s.count("PING") != 2 || s.count("SET") != 2 {
		t.Errorf("counts: PING %d, SET %d", s.count("PING"), s.count("SET"))
	}
}

// TestProtocolErrors: a request that is not RESP gets an error reply and
// the connection closes; a client that goes mid-command ends its
// connection with an error, and nothing of the command is run.
func TestProtocolErrors(t *testing.T) {
	for _, bad := range []string{"*x\r\n", "*1\r\n+PING\r\n", "*1\r\n$99999999999\r\n", "*1\r\n$2\r\nabcd\r\n"} {
		_, cl, raw, done := pipeClient(t)
		go raw.Write([]byte(bad))
		rp, err := cl.recv()
		if err != nil || rp.kind != '-' {
			t.Errorf("%q: %v, %v; want an error reply", bad, rp, err)
		}
		if err := <-done; !errors.Is(err, errProtocol) {
			t.Errorf("%q: the server's connection ended with %v", bad, err)
		}
	}
	s, _, raw, done := pipeClient(t)
	raw.Write([]byte("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$10\r\nhalf"))
	raw.Close()
	if err := <-done; !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("a command cut short: %v", err)
	}
	if s.count("SET") != 0 || len(s.str) != 0 {
		t.Error("a command cut short was run")
	}
}
