"""The shim's call-site resolver thread (`_Sites`), on a stand-in for the PyTorch helper: it
resolves stacks as they come, `close()` stops it and resolves what is left in the calling thread
before the recorder closes its traces, a second `close()` does nothing, and in a forked child
(another pid) `close()` touches nothing. Prints PASS."""
import os
import threading
import time

import alloctrace_hook as hook


class Helper:
    """Stand-in for the helper's call-site functions: `pending` stacks wait to be resolved."""

    def __init__(self):
        self.cv = threading.Condition()
        self.pending = 0
        self.resolved = []  # (thread name, count)
        self.stopped = False

    def add(self, n):
        with self.cv:
            self.pending += n
            self.cv.notify_all()

    def wait_sites(self, seconds):
        with self.cv:
            self.cv.wait_for(lambda: self.pending or self.stopped, timeout=seconds)
            return self.pending > 0

    def resolve_sites(self):
        with self.cv:
            n, self.pending = self.pending, 0
        if n:
            self.resolved.append((threading.current_thread().name, n))
        return n

    def stop_sites(self):
        with self.cv:
            self.stopped = True
            self.cv.notify_all()


h = Helper()
s = hook._Sites(h)
h.add(3)
deadline = time.time() + 5
while not h.resolved and time.time() < deadline:
    time.sleep(0.01)
assert h.resolved == [("alloctrace-callsites", 3)], h.resolved

# Stacks that come as the program ends are resolved by close(), after the thread stopped.
orig_stop = h.stop_sites


def stop_then_add():
    orig_stop()
    h.add(2)  # arrives after the thread's last look


h.stop_sites = stop_then_add
s.close()
assert not s.thread.is_alive(), "the thread is stopped"
assert h.resolved[-1] == (threading.current_thread().name, 2), h.resolved
s.close()  # a second close does nothing
assert len(h.resolved) == 2

# A forked child's copy: no thread to stop, nothing resolved there.
h2 = Helper()
s2 = hook._Sites(h2)
s2.pid = os.getpid() + 1
h2.add(1)
time.sleep(0.2)
before = list(h2.resolved)
s2.close()
assert not h2.stopped and h2.resolved == before, "a child's close touches nothing"
print("PASS")
