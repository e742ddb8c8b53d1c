#include "textflag.h"

// The built-in join helper (see cgexec.go), the entry point of a binary
// linked with -E cellvisor/cgexec.entry. It runs before Go's runtime
// exists: no stack checks, no calls, no memory but the stack the kernel
// gave it, only raw system calls.
//
//	cellvisor-cgexec TASKS... -- PROGRAM ARGS...
//	cellvisor-standby FD TASKS... -- PROGRAM ARGS...
//
// For each TASKS file it writes "0" (moving its own thread, the process's
// only one), then execs PROGRAM (a path, not searched) with ARGS and the
// environment it was given. A standby reads FD first and execs only after
// the line "exec" (exactly "exec\n" in one read), closing FD; anything else,
// or end of file, makes it exit 0. Failures write one line to stderr,
// "cellvisor-cgexec: cannot join|exec PATH: errno N" or "cellvisor-cgexec:
// bad arguments", and exit 126 (127 when PROGRAM does not exist), as the
// shell helper does. Any other argv[0] jumps to Go's own entry point.
//
// Registers: R12 argc, R13 argv, R14 the argument being read, R15 the
// standby's pipe (-1 when joining only), R8 an errno, R9 an exit status.

#define SYS_read 0
#define SYS_write 1
#define SYS_close 3
#define SYS_execve 59
#define SYS_exit_group 231
#define SYS_openat 257
#define AT_FDCWD $-100
#define O_WRONLY_CLOEXEC $0x80001
#define EINTR $-4
#define ENOENT $-2

DATA joinName<>+0(SB)/8, $"cellviso"
DATA joinName<>+8(SB)/8, $"r-cgexec"
DATA joinName<>+16(SB)/1, $0
GLOBL joinName<>(SB), RODATA|NOPTR, $17

DATA standbyName<>+0(SB)/8, $"cellviso"
DATA standbyName<>+8(SB)/8, $"r-standb"
DATA standbyName<>+16(SB)/1, $"y"
DATA standbyName<>+17(SB)/1, $0
GLOBL standbyName<>(SB), RODATA|NOPTR, $18

DATA zero<>+0(SB)/1, $"0"
GLOBL zero<>(SB), RODATA|NOPTR, $1

// "cellvisor-cgexec: cannot join "
DATA joinMsg<>+0(SB)/8, $"cellviso"
DATA joinMsg<>+8(SB)/8, $"r-cgexec"
DATA joinMsg<>+16(SB)/8, $": cannot"
DATA joinMsg<>+24(SB)/6, $" join "
GLOBL joinMsg<>(SB), RODATA|NOPTR, $30

// "cellvisor-cgexec: cannot exec "
DATA execMsg<>+0(SB)/8, $"cellviso"
DATA execMsg<>+8(SB)/8, $"r-cgexec"
DATA execMsg<>+16(SB)/8, $": cannot"
DATA execMsg<>+24(SB)/6, $" exec "
GLOBL execMsg<>(SB), RODATA|NOPTR, $30

// "cellvisor-cgexec: bad arguments\n"
DATA usageMsg<>+0(SB)/8, $"cellviso"
DATA usageMsg<>+8(SB)/8, $"r-cgexec"
DATA usageMsg<>+16(SB)/8, $": bad ar"
DATA usageMsg<>+24(SB)/8, $"guments\n"
GLOBL usageMsg<>(SB), RODATA|NOPTR, $32

// ": errno "
DATA errnoMsg<>+0(SB)/8, $": errno "
GLOBL errnoMsg<>(SB), RODATA|NOPTR, $8

// func entry()
TEXT ·entry(SB), NOSPLIT|NOFRAME, $0
	MOVQ	0(SP), R12
	LEAQ	8(SP), R13
	CMPQ	R12, $1
	JLT	runtime
	MOVQ	$-1, R15
	MOVQ	$1, R14
	MOVQ	0(R13), SI
	LEAQ	joinName<>(SB), DI
cmpjoin:
	MOVBLZX	(SI), AX
	MOVBLZX	(DI), BX
	CMPL	AX, BX
	JNE	trystandby
	TESTL	AX, AX
	JZ	joinloop
	INCQ	SI
	INCQ	DI
	JMP	cmpjoin

trystandby:
	MOVQ	0(R13), SI
	LEAQ	standbyName<>(SB), DI
cmpstandby:
	MOVBLZX	(SI), AX
	MOVBLZX	(DI), BX
	CMPL	AX, BX
	JNE	runtime
	TESTL	AX, AX
	JZ	standbyfd
	INCQ	SI
	INCQ	DI
	JMP	cmpstandby

	// argv[1] is the standby's pipe: one to five decimal digits.
standbyfd:
	CMPQ	R12, $2
	JLT	usage
	MOVQ	8(R13), SI
	XORQ	R15, R15
	MOVQ	$0, CX
fddigit:
	MOVBLZX	(SI), AX
	TESTL	AX, AX
	JZ	fdend
	SUBL	$48, AX
	CMPL	AX, $9
	JHI	usage
	IMULQ	$10, R15
	ADDQ	AX, R15
	INCQ	SI
	INCQ	CX
	CMPQ	CX, $5
	JGT	usage
	JMP	fddigit
fdend:
	TESTQ	CX, CX
	JZ	usage
	MOVQ	$2, R14

	// Join: write "0" (this thread) to each tasks file up to "--".
joinloop:
	CMPQ	R14, R12
	JGE	usage
	MOVQ	(R13)(R14*8), SI
	MOVBLZX	0(SI), AX
	CMPL	AX, $45
	JNE	join
	MOVBLZX	1(SI), AX
	CMPL	AX, $45
	JNE	join
	MOVBLZX	2(SI), AX
	TESTL	AX, AX
	JZ	joined
join:
	MOVQ	AT_FDCWD, DI
	MOVQ	O_WRONLY_CLOEXEC, DX
	XORQ	R10, R10
	MOVQ	$SYS_openat, AX
	SYSCALL
	CMPQ	AX, $-4096
	JHI	joinfail
	MOVQ	AX, BX
	MOVQ	BX, DI
	LEAQ	zero<>(SB), SI
	MOVQ	$1, DX
	MOVQ	$SYS_write, AX
	SYSCALL
	MOVQ	AX, R8
	MOVQ	BX, DI
	MOVQ	$SYS_close, AX
	SYSCALL
	MOVQ	R8, AX
	CMPQ	AX, $1
	JEQ	joinnext
	CMPQ	AX, $-4096
	JHI	joinfail
	MOVQ	$-5, AX // wrote nothing, with no error: EIO
	JMP	joinfail
joinnext:
	INCQ	R14
	JMP	joinloop

joined:
	INCQ	R14
	CMPQ	R14, R12
	JGE	usage
	TESTQ	R15, R15
	JS	exec

	// A standby waits for the line "exec"; anything else, or end of
	// file, and it exits 0 having started nothing.
	SUBQ	$16, SP
readagain:
	MOVQ	R15, DI
	MOVQ	SP, SI
	MOVQ	$16, DX
	MOVQ	$SYS_read, AX
	SYSCALL
	CMPQ	AX, EINTR
	JEQ	readagain
	CMPQ	AX, $5
	JNE	quit
	MOVL	0(SP), AX
	CMPL	AX, $0x63657865
	JNE	quit
	MOVBLZX	4(SP), AX
	CMPL	AX, $10
	JNE	quit
	ADDQ	$16, SP
	MOVQ	R15, DI
	MOVQ	$SYS_close, AX
	SYSCALL

exec:
	MOVQ	(R13)(R14*8), DI
	LEAQ	(R13)(R14*8), SI
	LEAQ	8(R13)(R12*8), DX
	MOVQ	$SYS_execve, AX
	SYSCALL
	MOVQ	AX, R8
	LEAQ	execMsg<>(SB), SI
	MOVQ	$30, DX
	MOVQ	$126, R9
	CMPQ	R8, ENOENT
	JNE	fail
	MOVQ	$127, R9
	JMP	fail

joinfail:
	MOVQ	AX, R8
	LEAQ	joinMsg<>(SB), SI
	MOVQ	$30, DX
	MOVQ	$126, R9

	// fail writes SI (DX bytes), argv[R14], ": errno " and -R8 to
	// stderr, then exits R9.
fail:
	MOVQ	$2, DI
	MOVQ	$SYS_write, AX
	SYSCALL
	MOVQ	(R13)(R14*8), SI
	XORQ	DX, DX
strlen:
	MOVBLZX	(SI)(DX*1), AX
	TESTL	AX, AX
	JZ	strlenend
	INCQ	DX
	JMP	strlen
strlenend:
	MOVQ	$2, DI
	MOVQ	$SYS_write, AX
	SYSCALL
	MOVQ	$2, DI
	LEAQ	errnoMsg<>(SB), SI
	MOVQ	$8, DX
	MOVQ	$SYS_write, AX
	SYSCALL
	// The errno in decimal, then a newline, built backwards below SP.
	MOVQ	R8, AX
	NEGQ	AX
	LEAQ	-1(SP), SI
	MOVB	$10, (SI)
	MOVQ	$1, CX
	MOVQ	$10, BX
digit:
	XORQ	DX, DX
	DIVQ	BX
	ADDQ	$48, DX
	DECQ	SI
	MOVB	DL, (SI)
	INCQ	CX
	TESTQ	AX, AX
	JNZ	digit
	MOVQ	CX, DX
	MOVQ	$2, DI
	MOVQ	$SYS_write, AX
	SYSCALL
	MOVQ	R9, DI
	MOVQ	$SYS_exit_group, AX
	SYSCALL

usage:
	MOVQ	$2, DI
	LEAQ	usageMsg<>(SB), SI
	MOVQ	$32, DX
	MOVQ	$SYS_write, AX
	SYSCALL
	MOVQ	$126, DI
	MOVQ	$SYS_exit_group, AX
	SYSCALL

quit:
	XORQ	DI, DI
	MOVQ	$SYS_exit_group, AX
	SYSCALL

runtime:
	JMP	_rt0_amd64_linux(SB)

// func entryPC() uintptr
TEXT ·entryPC(SB), NOSPLIT, $0-8
	LEAQ	·entry(SB), AX
	MOVQ	AX, ret+0(FP)
	RET
