# The process-control C API the supervisor uses (fastpath/_lifecycle.pyx), declared once.
from posix.types cimport pid_t, sigset_t
from posix.signal cimport siginfo_t
from posix.time cimport timespec

cdef extern from "<signal.h>" nogil:
    ctypedef void (*sighandler_t)(int)
    sighandler_t SIG_DFL
    sighandler_t SIG_ERR
    sighandler_t signal(int signum, sighandler_t handler)
    int pthread_sigmask(int how, const sigset_t *set, sigset_t *old)
    int sigtimedwait(const sigset_t *set, siginfo_t *info, const timespec *timeout)
    int SIG_BLOCK
    int SIG_SETMASK

cdef extern from "<sys/prctl.h>" nogil:
    int PR_SET_PDEATHSIG
    int prctl(int option, unsigned long arg2, unsigned long arg3, unsigned long arg4,
              unsigned long arg5)

cdef extern from "<unistd.h>" nogil:
    pid_t fork()
    pid_t getppid()
    pid_t getpid()
    void _exit(int status)

# What os.fork() does around fork(): the interpreter's locks and state stay usable in the child.
cdef extern from "Python.h":
    void PyOS_BeforeFork()
    void PyOS_AfterFork_Parent()
    void PyOS_AfterFork_Child()
