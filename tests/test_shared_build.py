"""conftest.py's one-time steps of a test run (the book builds, the widget JS): whichever
process asks first runs the step, the others wait on its file lock and skip it. The lock is
the filelock package's, so it works where fcntl does not exist (Windows)."""
import sys
import threading
import time

import conftest


def test_a_step_runs_once_without_fcntl(tmp_path, monkeypatch):
    """conftest.py itself needs no fcntl (filelock, imported before fcntl is hidden here so the
    rest of the run keeps its usual lock, takes msvcrt on Windows)."""
    import filelock  # noqa: F401
    monkeypatch.setitem(sys.modules, "fcntl", None)        # `import fcntl` raises ImportError
    calls = []
    conftest._once(tmp_path, "step", lambda: calls.append("made"))
    conftest._once(tmp_path, "step", lambda: calls.append("made again"))
    assert calls == ["made"]
    assert (tmp_path / "step.done").exists()


def test_waiters_skip_the_step_the_first_one_made(tmp_path):
    calls = []

    def make():
        calls.append(threading.current_thread().name)
        time.sleep(0.3)                                 # the others arrive while it runs

    threads = [threading.Thread(target=conftest._once, args=(tmp_path, "book", make),
                                name=f"worker{i}") for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
