package smcr

import "fmt"

// The decline diagnosis codes of Linux's net/smc (smc_clc.h): why a peer
// declined, carried in Decline.Diagnosis and reported by smc_diag as a
// socket's fallback reason or peer diagnosis.
const (
	DeclineMem          uint32 = 0x01010000 // insufficient memory
	DeclineTimeoutCL    uint32 = 0x02010000 // timeout waiting for confirm link
	DeclineTimeoutAL    uint32 = 0x02020000 // timeout waiting for add link
	DeclineCnfErr       uint32 = 0x03000000 // configuration error
	DeclinePeerNoSMC    uint32 = 0x03010000 // the peer did not indicate SMC (no TCP option)
	DeclineIPSec        uint32 = 0x03020000 // IPsec on the connection
	DeclineNoSMCDev     uint32 = 0x03030000 // no SMC device found (R or D)
	DeclineNoSMCDDev    uint32 = 0x03030001 // no SMC-D device found
	DeclineNoSMCRDev    uint32 = 0x03030002 // no SMC-R device found
	DeclineNoISM2Supp   uint32 = 0x03030003 // hardware has no ISMv2 support
	DeclineNoV2Ext      uint32 = 0x03030004 // the peer sent no v2 extension
	DeclineNoV2DExt     uint32 = 0x03030005 // the peer sent no SMC-Dv2 extension
	DeclineNoSEID       uint32 = 0x03030006 // the peer sent no system EID
	DeclineNoSMCD2Dev   uint32 = 0x03030007 // no SMC-Dv2 device found
	DeclineNoUEID       uint32 = 0x03030008 // no common user EID
	DeclineRelease      uint32 = 0x03030009 // release mismatch
	DeclineMaxConn      uint32 = 0x0303000a // max_conns not acceptable
	DeclineMaxLink      uint32 = 0x0303000b // max_links not acceptable
	DeclineFeatUnsupp   uint32 = 0x0303000c // supplemental features not supported
	DeclineModeUnsupp   uint32 = 0x03040000 // SMC modes do not match (R or D)
	DeclineRMBEEyeC     uint32 = 0x03050000 // peer has eyecatcher in RMBE
	DeclineOptUnsupp    uint32 = 0x03060000 // fastopen sockopt not supported
	DeclineDiffPrefix   uint32 = 0x03070000 // IP prefix / subnet mismatch
	DeclineGetVLANErr   uint32 = 0x03080000 // err to get vlan id of ip device
	DeclineISMVLANErr   uint32 = 0x03090000 // err to reg vlan id on ism dev
	DeclineNoActLink    uint32 = 0x030a0000 // no active smc-r link in lgr
	DeclineNoSrvLink    uint32 = 0x030b0000 // SMC-R link from srv not found
	DeclineVersMismatch uint32 = 0x030c0000 // SMC version mismatch
	DeclineMaxDMB       uint32 = 0x030d0000 // SMC-D DMB limit exceeded
	DeclineNoRoute      uint32 = 0x030e0000 // no route to peer
	DeclineNoIndirect   uint32 = 0x030f0000 // SMC-Rv2 indirect (gateway) not supported
	DeclineSyncErr      uint32 = 0x04000000 // synchronization error
	DeclinePeerDecl     uint32 = 0x05000000 // the peer declined during the handshake
	DeclineIntErr       uint32 = 0x09990000 // internal error
	DeclineErrRTok      uint32 = 0x09990001 // rtoken handling failed
	DeclineErrRdyLnk    uint32 = 0x09990002 // ib ready link failed
	DeclineErrRegBuf    uint32 = 0x09990003 // reg rdma bufs failed
)

var declineNames = map[uint32]string{
	DeclineMem: "MEM", DeclineTimeoutCL: "TIMEOUT_CL", DeclineTimeoutAL: "TIMEOUT_AL",
	DeclineCnfErr: "CNFERR", DeclinePeerNoSMC: "PEERNOSMC", DeclineIPSec: "IPSEC",
	DeclineNoSMCDev: "NOSMCDEV", DeclineNoSMCDDev: "NOSMCDDEV", DeclineNoSMCRDev: "NOSMCRDEV",
	DeclineNoISM2Supp: "NOISM2SUPP", DeclineNoV2Ext: "NOV2EXT", DeclineNoV2DExt: "NOV2DEXT",
	DeclineNoSEID: "NOSEID", DeclineNoSMCD2Dev: "NOSMCD2DEV", DeclineNoUEID: "NOUEID",
	DeclineRelease: "RELEASEERR", DeclineMaxConn: "MAXCONNERR", DeclineMaxLink: "MAXLINKERR", DeclineFeatUnsupp: "FEATUNSUPP",
	DeclineModeUnsupp: "MODEUNSUPP", DeclineRMBEEyeC: "RMBE_EC", DeclineOptUnsupp: "OPTUNSUPP",
	DeclineDiffPrefix: "DIFFPREFIX", DeclineGetVLANErr: "GETVLANERR", DeclineISMVLANErr: "ISMVLANERR",
	DeclineNoActLink: "NOACTLINK", DeclineNoSrvLink: "NOSRVLINK", DeclineVersMismatch: "VERSMISMAT",
	DeclineMaxDMB: "MAX_DMB", DeclineNoRoute: "NOROUTE", DeclineNoIndirect: "NOINDIRECT",
	DeclineSyncErr: "SYNCERR", DeclinePeerDecl: "PEERDECL", DeclineIntErr: "INTERR",
	DeclineErrRTok: "ERR_RTOK", DeclineErrRdyLnk: "ERR_RDYLNK", DeclineErrRegBuf: "ERR_REGBUF",
}

// DeclineName names a diagnosis code as net/smc does (SMC_CLC_DECL_*
// without the prefix), or gives it in hex when it is not one.
func DeclineName(code uint32) string {
	if n, ok := declineNames[code]; ok {
		return n
	}
	return fmt.Sprintf("0x%08x", code)
}
