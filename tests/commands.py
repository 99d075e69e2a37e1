"""Running the installed command-line tools from tests."""

import pathlib
import subprocess
import sys

BIN = pathlib.Path(sys.executable).parent


def run_command(name: str, *flags, input: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """The installed command ``name`` (``tft-…``) with ``flags``, text in and out, in a fresh process."""
    command = [str(BIN / name), *(str(flag) for flag in flags)]
    return subprocess.run(command, input=input, capture_output=True, text=True, timeout=timeout)


def export_cli(run_dir, output, *flags):
    """``tft-export`` of ``run_dir`` to ``output`` (maximum output length input + 10) in a fresh process."""
    command = [str(BIN / "tft-export"), "--model_dir", str(run_dir), "--output", str(output)]
    result = subprocess.run(
        [*command, "--max_extra_length", "10", *flags],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return output
