"""Freeze and thaw one thread of a running process, leaving its other
threads running: what a stall of the proxy's serving thread looks like to
everything else (the admin listener, the reaper, the clients).

    with freeze_thread(proxy.proc.pid, "ip-serve"):
        ...  # the serving loop does nothing here; /readyz still answers

The thread is found by its name (/proc/PID/task/*/comm; the proxy names
its threads with pthread_setname_np) and stopped with ptrace: PTRACE_SEIZE,
then PTRACE_INTERRUPT, which stops that thread alone (SIGSTOP would stop
the whole process). PTRACE_DETACH thaws it. The tracer is the calling OS
thread: freeze and thaw from the same Python thread. If the test process
dies, the kernel detaches and the thread runs again."""
import contextlib
import ctypes
import os

PTRACE_DETACH = 17
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
WALL = 0x40000000  # __WALL: wait for a thread that is not a child process

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.restype = ctypes.c_long
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]


def thread_ids(pid, name):
    """The ids of pid's threads named name."""
    out = []
    base = "/proc/%d/task" % pid
    for tid in os.listdir(base):
        try:
            with open(os.path.join(base, tid, "comm")) as f:
                if f.read().strip() == name:
                    out.append(int(tid))
        except OSError:
            pass  # the thread ended meanwhile
    return sorted(out)


def thread_id(pid, name):
    """The one thread of pid named name (AssertionError if not exactly one)."""
    tids = thread_ids(pid, name)
    assert len(tids) == 1, "threads of %d named %r: %r" % (pid, name, tids)
    return tids[0]


def _ptrace(req, tid, addr=None, data=None):
    if _libc.ptrace(req, tid, addr, data) == -1:
        e = ctypes.get_errno()
        raise OSError(e, "ptrace(%#x, %d): %s" % (req, tid, os.strerror(e)))


def freeze(tid):
    """Stops thread tid (seized by the calling thread) and waits until it
    has stopped."""
    _ptrace(PTRACE_SEIZE, tid)
    try:
        _ptrace(PTRACE_INTERRUPT, tid)
        _, status = os.waitpid(tid, WALL)
        assert os.WIFSTOPPED(status), "thread %d did not stop: %#x" % (tid, status)
    except BaseException:
        thaw(tid)
        raise


def thaw(tid):
    """Lets thread tid run again (it must be stopped by freeze)."""
    try:
        _ptrace(PTRACE_DETACH, tid)
    except ProcessLookupError:
        pass  # the thread (or the process) is gone


@contextlib.contextmanager
def freeze_thread(pid, name="ip-serve"):
    """Holds pid's thread called name stopped for the with block; yields
    its thread id."""
    tid = thread_id(pid, name)
    freeze(tid)
    try:
        yield tid
    finally:
        thaw(tid)


def thread_state(tid):
    """The state letter of /proc/TID/stat ('t' while frozen)."""
    with open("/proc/%d/stat" % tid) as f:
        return f.read().rsplit(")", 1)[1].split()[0]
