"""The program name, the error types of ``train_gpt.py`` and its Ctrl-C flag (shared by the modules beside it).

Ctrl-C (:data:`INTERRUPT`): the example's :class:`train.StopFlag` (the SIGINT handler only sets a flag, which
the training loop reads at safe points: after start-up, after each step -- the first one compiles --, after an
evaluation, after a checkpoint write), where the run stops cleanly: it saves a checkpoint and prints one line
saying what was saved and how to resume (:class:`Interrupted`, exit code 130). A ``KeyboardInterrupt`` raised
wherever the main thread happens to be instead broke two things (issue 41): raised while XLA compiled a program
on its own thread pool, it let the interpreter exit and tear the runtime down under the still-running
compilation, which then crashed (``SIGSEGV`` in ``xla::ifrt::SingleDeviceSharding::Create`` on a compile worker
thread, 13 of 33 tries in the ~3 s before step 1); raised inside a Python callback called from XLA, it was
swallowed there and training went on. A second Ctrl-C quits at once; if stopping takes longer than
:data:`NOTICE_AFTER_S` (a long compilation or checkpoint write), one line says so and how to quit at once.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

from train import StopFlag

PROG = "train_gpt.py"


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped the run at a safe point; ``str()`` is the one line saying what was saved and how to
    resume (exit code 130). A ``KeyboardInterrupt``, so callers that only know that one still stop."""


class Diverged(Exception):
    """A non-finite training loss, gradient norm or validation loss: the run stopped at that step without
    writing a checkpoint after it; ``str()`` names the step and the last good checkpoint (exit code 1)."""


#: seconds after a Ctrl-C before a line says that the run is still stopping (a long compilation, a
#: checkpoint write); a quicker stop prints only its one line
NOTICE_AFTER_S = 3.0

#: test hook: ``TRAIN_GPT_TEST_PAUSE=<point>`` (``startup``, ``eval``, ``save``) makes the run print
#: ``train_gpt.py: test pause at <point>`` the first time it reaches that point and wait there until
#: Ctrl-C (at most 60 s), so a test can interrupt it at that exact point; ``compile`` prints it right
#: before the first train step (which compiles) and goes on
TEST_PAUSE_ENV = "TRAIN_GPT_TEST_PAUSE"


class HarnessStopFlag(StopFlag):
    """The example's Ctrl-C flag with a notice when stopping takes long, a scope (:meth:`handling`) and the test
    hook (:meth:`pause`)."""

    def __init__(self):
        self._paused, self._timer = set(), None

    def on_sigint(self, signum, frame):
        super().on_sigint(signum, frame)
        if self._timer is None:
            self._timer = threading.Timer(NOTICE_AFTER_S, self._notice)
            self._timer.daemon = True
            self._timer.start()

    def _notice(self):
        sys.stderr.write(f"\n{PROG}: Ctrl-C: stopping after the current compilation, evaluation or checkpoint "
                         "write (Ctrl-C again quits at once, without saving)\n")
        sys.stderr.flush()

    def done(self) -> None:
        """The run has stopped: no "still stopping" line any more."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def uninstall(self) -> None:
        self.done()
        super().uninstall()

    @contextlib.contextmanager
    def handling(self):
        """Ctrl-C sets :attr:`requested` inside the block (the handler installed here, or earlier by the
        script, keeping a Ctrl-C that came before); the previous handler is back after it."""
        fresh = self.install()
        if fresh:
            self.requested = False
        try:
            yield self
        finally:
            if fresh:
                self.uninstall()
            else:
                self.done()

    def pause(self, point: str, wait: bool = True) -> None:
        """The test hook (:data:`TEST_PAUSE_ENV`): at ``point``, once, say so and wait for Ctrl-C (without
        ``wait``: go on at once, e.g. into a compilation that the signal is to interrupt)."""
        if os.environ.get(TEST_PAUSE_ENV) != point or point in self._paused:
            return
        self._paused.add(point)
        sys.stderr.write(f"{PROG}: test pause at {point}\n")
        sys.stderr.flush()
        t0 = time.monotonic()
        if not wait:
            return
        while not self.requested and time.monotonic() - t0 < 60:
            time.sleep(0.02)


#: the Ctrl-C flag of ``train_gpt.py`` (one per process: signal handlers are per process)
INTERRUPT = HarnessStopFlag()
