package meta

import (
	"time"

	"github.com/krcore/krcore/verbs"
)

// reader is an RC QP through which one client READs the table: the DC-less
// path to it. It allows remote READ and nothing else.
type reader struct {
	qp verbs.QP
	at time.Time // when it was connected: the oldest goes first
}

// connectReader answers a connect request: an RC QP connected to the
// client's, replacing the one that client had (it reconnects after an
// error). A retried request is answered from the dedup cache, so a copy
// does not make a second QP. Past MaxReaders the oldest reader is closed.
func (s *Server) connectReader(req *request, now time.Time) reply {
	rep := reply{op: req.op, id: req.id, node: req.node}
	qp, err := s.pd.CreateQP(verbs.QPInit{Type: verbs.RC, SendCQ: s.cq, RecvCQ: s.cq,
		Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err == nil {
		remote := req.reply
		remote.QPN, remote.PSN = req.rcQPN, req.rcPSN
		if err = verbs.Connect(qp, remote, verbs.Path{Access: verbs.AccessRemoteRead}); err != nil {
			qp.Close()
		}
	}
	if err != nil {
		rep.status = stInvalid
		return rep
	}
	s.dropReader(req.node)
	if len(s.readers) >= s.cfg.MaxReaders {
		s.dropReader(s.oldestReader())
	}
	s.readers[req.node] = &reader{qp: qp, at: now}
	s.stats.readers.Add(1)
	ep := qp.Endpoint()
	rep.qpn, rep.psn = ep.QPN, ep.PSN
	return rep
}

// dropReader closes client's reader, if it has one.
func (s *Server) dropReader(client uint64) {
	if r := s.readers[client]; r != nil {
		r.qp.Close()
		delete(s.readers, client)
		s.stats.readers.Add(-1)
	}
}

// oldestReader is the client whose reader was connected first.
func (s *Server) oldestReader() uint64 {
	var id uint64
	var at time.Time
	for k, r := range s.readers {
		if id == 0 || r.at.Before(at) {
			id, at = k, r.at
		}
	}
	return id
}
