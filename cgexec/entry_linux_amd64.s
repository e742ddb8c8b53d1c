#include "textflag.h"

// The built-in join helper (see cgexec.go), the entry point of a binary
// linked with -E cellvisor/cgexec.entry. It runs before Go's runtime
// exists: no stack checks, no calls, no memory but the stack the kernel
// gave it, only raw system calls.
//
//	cellvisor-cgexec [+UID:GID] TASKS... -- PROGRAM ARGS...
//	cellvisor-standby FD [+UID:GID] TASKS... -- PROGRAM ARGS...
//
// For each TASKS file it writes "0" (moving its own thread, the process's
// only one); with +UID:GID it then drops its supplementary groups, sets
// its real, effective and saved gid and uid, drops CAP_SETGID and
// CAP_SETUID from its inheritable set (which drops them from the ambient
// one: the program cannot gain them at its exec) and sets its umask to
// 007; then it execs PROGRAM (a path, not searched) with ARGS and the
// environment it was given. A standby reads FD first and execs only after
// the line "exec" (exactly "exec\n" in one read), closing FD; anything else,
// or end of file, makes it exit 0. Failures write one line to stderr,
// "cellvisor-cgexec: cannot join|exec PATH: errno N" or "cellvisor-cgexec:
// bad arguments", and exit 126 (127 when PROGRAM does not exist), as the
// shell helper does. Any other argv[0] jumps to Go's own entry point.
//
// Registers: R12 argc, R13 argv, R14 the argument being read, R15 the
// standby's pipe (-1 when joining only), R8 an errno, R9 an exit status
// (the uid to become, and BX the gid, while they are set).

#define SYS_read 0
#define SYS_write 1
#define SYS_close 3
#define SYS_execve 59
#define SYS_exit_group 231
#define SYS_openat 257
#define SYS_umask 95
#define SYS_setgroups 116
#define SYS_setresuid 117
#define SYS_setresgid 119
#define SYS_capget 125
#define SYS_capset 126
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

// "cellvisor-cgexec: cannot become "
DATA becomeMsg<>+0(SB)/8, $"cellviso"
DATA becomeMsg<>+8(SB)/8, $"r-cgexec"
DATA becomeMsg<>+16(SB)/8, $": cannot"
DATA becomeMsg<>+24(SB)/8, $" become "
GLOBL becomeMsg<>(SB), RODATA|NOPTR, $32

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
	JZ	credskip
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

	// A user to become ("+UID:GID") is read once joined: skip it here.
credskip:
	CMPQ	R14, R12
	JGE	usage
	MOVQ	(R13)(R14*8), SI
	MOVBLZX	0(SI), AX
	CMPL	AX, $43
	JNE	joinloop
	INCQ	R14

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

	// The user to become, if any: argv[1] (argv[2] for a standby).
	MOVQ	$1, CX
	TESTQ	R15, R15
	JS	credarg
	MOVQ	$2, CX
credarg:
	MOVQ	(R13)(CX*8), SI
	MOVBLZX	0(SI), AX
	CMPL	AX, $43
	JNE	waitrelease
	// UID into R9, GID into BX: one to ten digits each, below 2^32-1.
	INCQ	SI
	XORQ	R9, R9
	XORQ	DX, DX
uiddigit:
	MOVBLZX	(SI), AX
	CMPL	AX, $58
	JEQ	uidend
	SUBL	$48, AX
	CMPL	AX, $9
	JHI	usage
	IMULQ	$10, R9
	ADDQ	AX, R9
	INCQ	SI
	INCQ	DX
	CMPQ	DX, $10
	JGT	usage
	JMP	uiddigit
uidend:
	TESTQ	DX, DX
	JZ	usage
	INCQ	SI
	XORQ	BX, BX
	XORQ	DX, DX
giddigit:
	MOVBLZX	(SI), AX
	TESTL	AX, AX
	JZ	gidend
	SUBL	$48, AX
	CMPL	AX, $9
	JHI	usage
	IMULQ	$10, BX
	ADDQ	AX, BX
	INCQ	SI
	INCQ	DX
	CMPQ	DX, $10
	JGT	usage
	JMP	giddigit
gidend:
	TESTQ	DX, DX
	JZ	usage
	MOVQ	$0xfffffffe, AX
	CMPQ	R9, AX
	JHI	usage
	CMPQ	BX, AX
	JHI	usage
	MOVQ	CX, R14 // a failure names the +UID:GID argument
	XORQ	DI, DI
	XORQ	SI, SI
	MOVQ	$SYS_setgroups, AX
	SYSCALL
	CMPQ	AX, $-4096
	JHI	becomefail
	MOVQ	BX, DI
	MOVQ	BX, SI
	MOVQ	BX, DX
	MOVQ	$SYS_setresgid, AX
	SYSCALL
	CMPQ	AX, $-4096
	JHI	becomefail
	MOVQ	R9, DI
	MOVQ	R9, SI
	MOVQ	R9, DX
	MOVQ	$SYS_setresuid, AX
	SYSCALL
	CMPQ	AX, $-4096
	JHI	becomefail
	// CAP_SETGID and CAP_SETUID out of the inheritable set, and so out of
	// the ambient one (capget, clear, capset: version 3, this process).
	SUBQ	$32, SP
	MOVL	$0x20080522, 0(SP)
	MOVL	$0, 4(SP)
	LEAQ	0(SP), DI
	LEAQ	8(SP), SI
	MOVQ	$SYS_capget, AX
	SYSCALL
	CMPQ	AX, $-4096
	JHI	becomefail
	ANDL	$0xffffff3f, 16(SP)
	LEAQ	0(SP), DI
	LEAQ	8(SP), SI
	MOVQ	$SYS_capset, AX
	SYSCALL
	CMPQ	AX, $-4096
	JHI	becomefail
	ADDQ	$32, SP
	MOVQ	$7, DI
	MOVQ	$SYS_umask, AX
	SYSCALL
	// Back to the program's argument.
	MOVQ	$2, R14
	TESTQ	R15, R15
	JS	findprog
	MOVQ	$3, R14
findprog:
	MOVQ	(R13)(R14*8), SI
	INCQ	R14
	MOVBLZX	0(SI), AX
	CMPL	AX, $45
	JNE	findprog
	MOVBLZX	1(SI), AX
	CMPL	AX, $45
	JNE	findprog
	MOVBLZX	2(SI), AX
	TESTL	AX, AX
	JNZ	findprog

waitrelease:
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
	JMP	fail

becomefail:
	MOVQ	AX, R8
	LEAQ	becomeMsg<>(SB), SI
	MOVQ	$32, DX
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
