//go:build linux

#include "textflag.h"

// func rdtscpCPU() uint32
TEXT ·rdtscpCPU(SB), NOSPLIT, $0-4
	RDTSCP
	ANDL $0xfff, CX
	MOVL CX, ret+0(FP)
	RET

// func cpuidExtEDX() uint32
TEXT ·cpuidExtEDX(SB), NOSPLIT, $0-4
	MOVL $0x80000000, AX
	XORL CX, CX
	CPUID
	CMPL AX, $0x80000001
	JB   none
	MOVL $0x80000001, AX
	XORL CX, CX
	CPUID
	MOVL DX, ret+0(FP)
	RET
none:
	MOVL $0, ret+0(FP)
	RET
