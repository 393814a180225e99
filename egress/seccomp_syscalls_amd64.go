package egress

import "golang.org/x/sys/unix"

// seccompArch is the audit architecture a filter built here checks.
const seccompArch = unix.AUDIT_ARCH_X86_64

// x32 system calls (numbers from this bit up) are refused.
const x32Bit = 0x40000000

// parserSyscalls are the system calls the resolver's DNS part makes: the
// Go runtime's (memory, threads, signals, timers, the network poller),
// sockets to the upstream servers, and files in its one directory. tgkill
// is allowed separately, to its own process only; execve, ptrace, kill,
// mount, bpf, keyctl and the rest are refused.
var parserSyscalls = []uint32{
	unix.SYS_READ, unix.SYS_WRITE, unix.SYS_CLOSE, unix.SYS_FSTAT, unix.SYS_NEWFSTATAT, unix.SYS_LSEEK,
	unix.SYS_PREAD64, unix.SYS_PWRITE64, unix.SYS_READV, unix.SYS_WRITEV,
	unix.SYS_MMAP, unix.SYS_MUNMAP, unix.SYS_MPROTECT, unix.SYS_MADVISE, unix.SYS_BRK, unix.SYS_MINCORE,
	unix.SYS_RT_SIGACTION, unix.SYS_RT_SIGPROCMASK, unix.SYS_RT_SIGRETURN, unix.SYS_SIGALTSTACK,
	unix.SYS_EXIT, unix.SYS_EXIT_GROUP, unix.SYS_FUTEX, unix.SYS_SCHED_YIELD,
	unix.SYS_SCHED_GETAFFINITY, unix.SYS_GETPID, unix.SYS_GETTID, unix.SYS_SET_ROBUST_LIST,
	unix.SYS_SET_TID_ADDRESS, unix.SYS_RSEQ, unix.SYS_ARCH_PRCTL, unix.SYS_RESTART_SYSCALL,
	unix.SYS_NANOSLEEP, unix.SYS_CLOCK_NANOSLEEP, unix.SYS_CLOCK_GETTIME, unix.SYS_GETTIMEOFDAY,
	unix.SYS_TIMER_CREATE, unix.SYS_TIMER_SETTIME, unix.SYS_TIMER_DELETE, unix.SYS_SETITIMER,
	unix.SYS_GETRANDOM, unix.SYS_PRLIMIT64, unix.SYS_GETRLIMIT, unix.SYS_UNAME,
	unix.SYS_EPOLL_CREATE1, unix.SYS_EPOLL_CTL, unix.SYS_EPOLL_WAIT, unix.SYS_EPOLL_PWAIT, unix.SYS_EPOLL_PWAIT2,
	unix.SYS_EVENTFD2, unix.SYS_PIPE2, unix.SYS_FCNTL, unix.SYS_PPOLL,
	unix.SYS_OPENAT, unix.SYS_UNLINKAT, unix.SYS_RENAMEAT, unix.SYS_RENAMEAT2, unix.SYS_FSYNC, unix.SYS_FDATASYNC,
	unix.SYS_CONNECT, unix.SYS_ACCEPT4, unix.SYS_GETSOCKNAME, unix.SYS_GETPEERNAME,
	unix.SYS_SETSOCKOPT, unix.SYS_GETSOCKOPT, unix.SYS_SENDTO, unix.SYS_RECVFROM, unix.SYS_SENDMSG,
	unix.SYS_RECVMSG, unix.SYS_SHUTDOWN,
}
