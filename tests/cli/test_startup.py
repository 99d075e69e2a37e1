"""The commands' standard error: TensorFlow's CPU-only notices dropped, every other line kept, even on a crash."""

import os
import select
import subprocess
import sys
import time

import pytest

from tf_transformer.cli.startup import CPU_NOTICES, NO_GPU_NOTICES, notices_pattern

WRITER = r"""
import os, re, sys
from tf_transformer.cli.startup import filter_stderr, notices_pattern
filter_stderr(notices_pattern())
lines = [
    "W0000 00:00:1.0 1 port.cc:153] oneDNN custom operations are on. You may see slightly different numerical results",
    "E0000 00:00:1.0 1 cuda_executor.cc:1228] failed call to cuInit: INTERNAL: CUDA error: Failed call to cuInit",
    "E0000 00:00:1.0 1 util.cc:131] oneDNN supports DT_INT64 only on platforms with AVX-512. Falling back",
    "E0000 00:00:1.0 1 real_error.cc:1] a real error the user must see",
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
]
for line in lines:
    os.write(2, (line + "\n").encode())
print("python's own stderr line", file=sys.stderr, flush=True)
if sys.argv[1] == "abort":
    os.write(2, b"last words before the crash\n")
    os.abort()
"""


@pytest.mark.parametrize("ending", ["exit", "abort"])
def test_notices_are_dropped_and_everything_else_gets_through(ending):
    result = subprocess.run([sys.executable, "-c", WRITER, ending], capture_output=True, text=True, timeout=60)
    assert "oneDNN custom operations" not in result.stderr
    assert "DT_INT64" not in result.stderr
    assert "InitializeLog" not in result.stderr
    assert "a real error the user must see" in result.stderr
    assert "python's own stderr line" in result.stderr
    if ending == "abort":
        assert result.returncode != 0 and "last words before the crash" in result.stderr
    else:
        assert result.returncode == 0


def test_a_cuinit_failure_is_shown_where_there_is_a_gpu(monkeypatch):
    from tf_transformer.cli import startup

    monkeypatch.setattr(startup, "has_nvidia_device", lambda: False)
    assert notices_pattern().search("E0000 cuda_executor.cc] failed call to cuInit: INTERNAL")
    monkeypatch.setattr(startup, "has_nvidia_device", lambda: True)
    assert not notices_pattern().search("E0000 cuda_executor.cc] failed call to cuInit: INTERNAL")
    assert not notices_pattern().search("E0000 something.cc] out of memory")
    assert NO_GPU_NOTICES and all(notice not in NO_GPU_NOTICES for notice in CPU_NOTICES)


def test_a_progress_line_rewritten_in_place_gets_through_as_it_goes():
    writer = (
        "import os, time\n"
        "from tf_transformer.cli.startup import filter_stderr, notices_pattern\n"
        "filter_stderr(notices_pattern())\n"
        "os.write(2, b'\\rtranslated 1/3')\n"
        "os.write(2, b'\\rtranslated 2/3')\n"
        "time.sleep(20)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", writer], stderr=subprocess.PIPE)
    try:
        seen = b""
        deadline = time.monotonic() + 15
        while b"translated 1/3" not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([process.stderr], [], [], 0.5)
            if ready:
                seen += os.read(process.stderr.fileno(), 4096)
        assert b"translated 1/3" in seen and process.poll() is None  # shown while the command still runs
    finally:
        process.kill()
        process.wait()
