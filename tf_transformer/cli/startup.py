"""The commands' standard error without TensorFlow's notices that look like errors on a CPU-only machine.

A TensorFlow wheel built with CUDA support probes for a GPU when it starts and
writes what it found to standard error before its logging is configured, so
``TF_CPP_MIN_LOG_LEVEL`` does not hide it: with NVIDIA's driver libraries
installed and no GPU, ``E0000 … failed call to cuInit`` at ERROR level; oneDNN
adds more such lines at the first step. Raising the log level would hide real
errors too. Instead, a command's standard error goes through a small filter
process that drops the known notices below and passes every other line on. As
a separate process reading until the pipe closes, it loses nothing when the
command crashes. A cuInit failure is dropped only where the machine has no
NVIDIA device: where it has one, that line is a real error.
"""

from __future__ import annotations

import atexit
import glob
import os
import re
import subprocess
import sys

# Notices TensorFlow prints on CPU-only machines; nothing a user can act on.
CPU_NOTICES = [
    r"All log messages before absl::InitializeLog\(\) is called are written to STDERR",
    r"oneDNN custom operations are on",
    r"oneDNN supports DT_[A-Z0-9]+ only on platforms with",
    r"Could not find cuda drivers on your machine",
    r"This TensorFlow binary is optimized to use available CPU instructions",
    r"To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags",
    r"Unable to register cu(DNN|FFT|BLAS) factory",
    r"computation placer already registered",
    r"TF-TRT Warning: Could not find TensorRT",
]
NO_GPU_NOTICES = [r"failed call to cuInit"]

# The filter: every piece of its standard input up to a newline or a carriage return (a
# progress line rewritten in place) that matches none of the notices goes on to its standard
# output, the command's real standard error. It runs in a session of its own, so Ctrl-C and
# signals sent to the command's process group leave it running: the command's last words (a
# traceback) still get through, and it ends when the pipe closes.
_FILTER = r"""
import os, re, sys
notices = re.compile(sys.argv[1])
pending = b""
while True:
    chunk = os.read(0, 65536)
    if not chunk:
        break
    pending += chunk
    pieces = re.split(rb"(?<=[\r\n])", pending)
    pending = pieces.pop()  # no newline or carriage return yet: wait for the rest
    for piece in pieces:
        if not notices.search(piece.decode("utf-8", "replace")):
            os.write(1, piece)
if pending and not notices.search(pending.decode("utf-8", "replace")):
    os.write(1, pending)
"""


def has_nvidia_device() -> bool:
    """Whether the kernel shows an NVIDIA GPU (a device node or a driver entry)."""
    return bool(glob.glob("/dev/nvidia[0-9]*") or glob.glob("/proc/driver/nvidia/gpus/*"))


def notices_pattern() -> re.Pattern:
    return re.compile("|".join(CPU_NOTICES + ([] if has_nvidia_device() else NO_GPU_NOTICES)))


def filter_stderr(pattern: re.Pattern) -> None:
    """Sends this process's standard error (file descriptor 2: C++ and Python alike) through the filter.

    Does nothing where there is no standard error (closed), or with ``TFT_RAW_STDERR=1``.
    """
    if os.environ.get("TFT_RAW_STDERR") == "1" or sys.stderr is None:
        return
    try:
        sys.stderr.flush()
        original = os.dup(2)
    except OSError:  # standard error closed
        return
    process = subprocess.Popen(
        [sys.executable, "-c", _FILTER, pattern.pattern],
        stdin=subprocess.PIPE,
        stdout=original,
        stderr=original,
        start_new_session=True,
    )
    os.dup2(process.stdin.fileno(), 2)
    process.stdin.close()  # file descriptor 2 now holds the pipe open

    def restore():
        sys.stderr.flush()
        os.dup2(original, 2)  # the pipe closes: the filter writes what is left, then ends
        try:
            process.wait(timeout=2)
        except subprocess.TimeoutExpired:  # a child of this process still holds the pipe: it ends with that
            pass

    atexit.register(restore)


_started = False


def start_tensorflow():
    """Filters standard error (once per process), then imports TensorFlow and lets it find its devices.

    Call before anything else imports TensorFlow. TensorFlow's runtime is not
    started: thread pools and distribution strategies can still be configured.
    Returns the ``tensorflow`` module.
    """
    global _started
    if not _started:
        _started = True
        filter_stderr(notices_pattern())
    import tensorflow as tf  # after tf_transformer (this package's parent), which set its oneDNN default

    tf.config.list_physical_devices()  # the GPU probe, and what it prints, while filtered
    return tf
