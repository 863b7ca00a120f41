import sys
import threading

import pytest

from argus.threads import start_daemon


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's thread names are Linux's")
def test_a_server_thread_is_named_to_the_kernel_too() -> None:
    """``top -H`` and ``bench/scale.py``'s CPU by thread read the kernel's name, 15 bytes of it."""
    seen: dict[str, str] = {}
    done = threading.Event()

    def run() -> None:
        tid = threading.get_native_id()
        with open(f"/proc/self/task/{tid}/comm") as f:
            seen["comm"] = f.read().strip()
        seen["python"] = threading.current_thread().name
        done.set()

    thread = start_daemon(run, "argus-writer-of-batches")
    assert done.wait(10)
    thread.join(10)
    assert thread.daemon
    assert seen == {"comm": "argus-writer-of", "python": "argus-writer-of-batches"}
    with open(f"/proc/self/task/{threading.get_native_id()}/comm") as f:
        assert f.read().strip() != "argus-writer-of", "the caller's own name is left alone"
