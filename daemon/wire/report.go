package wire

import (
	"encoding/json"
	"time"
)

// Bounds of the reports a client keeps at the daemon (OpReport).
const (
	// MaxReport bounds a report's body: what is left of a message once
	// OpReports's entry header and a name are taken.
	MaxReport = 48 << 10
	// MaxReports bounds the reports one client keeps.
	MaxReports = 16
	// MaxReportName bounds a report's name.
	MaxReportName = 64
)

// Report is one report a client keeps at the daemon: what a library
// running in the client's process over krcore (package smc) tells
// krctl and the daemon's metrics about itself, since the daemon cannot
// see it. A client sends its report again when it changes (OpReport,
// replacing the one of the same name) and the daemon drops its reports
// when it detaches. OpReports lists them, client by client.
type Report struct {
	Client uint64          `json:"client"`
	PID    int32           `json:"pid"`
	UID    uint32          `json:"uid"`
	Name   string          `json:"name"`
	Age    time.Duration   `json:"age"` // since the client sent it
	Body   json.RawMessage `json:"body"`
}

// reportHeader is an entry's size in OpReports's response besides its
// name and body.
const reportHeader = 8 + 4 + 4 + 8 + 2 + 2

// ReportSize is the room r takes in OpReports's response.
func ReportSize(r *Report) int { return reportHeader + len(r.Name) + len(r.Body) }

// PutReport appends r as an entry of OpReports's response: u64 client,
// u32 pid, u32 uid, u64 age in ns, str name, str body.
func PutReport(m *Msg, r *Report) {
	m.U64(r.Client).U32(uint32(r.PID)).U32(r.UID).U64(uint64(r.Age)).Str(r.Name).Str(string(r.Body))
}

// GetReport reads what PutReport wrote.
func GetReport(m *Msg) Report {
	r := Report{Client: m.GetU64(), PID: int32(m.GetU32()), UID: m.GetU32(), Age: time.Duration(m.GetU64())}
	r.Name = m.GetStr()
	r.Body = json.RawMessage(m.GetStr())
	return r
}
