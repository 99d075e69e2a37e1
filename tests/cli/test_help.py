"""Every installed command's ``--help`` (``-h``, ``--helpshort``): its usage and its own flags, without TensorFlow."""

import ast
import json
import pathlib
import re
import subprocess
import sys

import pytest

from tests.commands import run_command

SETUP_PY = pathlib.Path(__file__).resolve().parents[2] / "setup.py"

# Run in a fresh process: the flags each project module registers (a command module, or a
# helper it calls such as define_thread_flags), with their help; absl's and TensorFlow's excluded.
FLAGS_OF_MODULE = r"""
import importlib, json, sys
from absl import flags
module = importlib.import_module(sys.argv[1])
found = {}
for name in list(flags.FLAGS):
    flag = flags.FLAGS[name]
    defined_in = flags.FLAGS.find_module_defining_flag(name) or ""
    if name == flag.name and defined_in.split(".")[0] in ("tf_transformer", "configs", "pipelines"):
        found[name] = {"help": flag.help, "boolean": flag.boolean}
json.dump({"doc": module.__doc__, "flags": found}, sys.stdout)
"""

# absl's and TensorFlow's flags, which --helpfull lists and --help must not.
FOREIGN_FLAGS = ["logtostderr", "verbosity", "flagfile", "only_check_args", "tt_check_filter"]


def console_scripts() -> dict[str, str]:
    """setup.py's console scripts, command → module, read from its source so that a new command is tested."""
    for node in ast.walk(ast.parse(SETUP_PY.read_text(encoding="utf-8"))):
        if isinstance(node, ast.keyword) and node.arg == "entry_points":
            entries = ast.literal_eval(node.value)["console_scripts"]
            return {
                name.strip(): target.split(":")[0].strip()
                for name, target in (entry.split("=", 1) for entry in entries)
            }
    raise AssertionError("setup.py has no entry_points")


def squeezed(text: str) -> str:
    """``text`` without whitespace: absl wraps help text, breaking lines at spaces and hyphens."""
    return "".join(text.split())


@pytest.mark.parametrize("command, module", sorted(console_scripts().items()))
def test_help_shows_the_commands_own_flags_and_no_others(command, module, monkeypatch):
    defined = subprocess.run(
        [sys.executable, "-c", FLAGS_OF_MODULE, module], capture_output=True, text=True, timeout=120
    )
    assert defined.returncode == 0, defined.stderr[-3000:]
    expected = json.loads(defined.stdout)
    assert expected["flags"], f"{module} defines no flags"
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")  # each imported module, on standard error

    result = run_command(command, "--help", timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    help_text = result.stdout
    assert help_text.splitlines()[0] == expected["doc"].splitlines()[0].replace("``", "")
    listed = re.findall(r"^  (?:-\S+,)?--(?:\[no\])?(\w+):", help_text, flags=re.MULTILINE)
    assert sorted(listed) == sorted(expected["flags"])
    for name, flag in expected["flags"].items():
        label = f"--[no]{name}:" if flag["boolean"] else f"--{name}:"
        assert squeezed(label + flag["help"]) in squeezed(help_text), f"{command}: {name}'s help"
    for foreign in FOREIGN_FLAGS:
        assert not re.search(rf"--(\[no\])?{foreign}:", help_text), foreign
    imported = re.findall(r"^import time:.*\|\s*(\S+)$", result.stderr, flags=re.MULTILINE)
    heavy = sorted({name.split(".")[0] for name in imported} & {"tensorflow", "keras"})
    assert imported and not heavy, f"{command} --help imports {heavy}"

    monkeypatch.delenv("PYTHONPROFILEIMPORTTIME")
    for option in ("-h", "--helpshort"):
        alias = run_command(command, option, timeout=120)
        assert (alias.returncode, alias.stdout) == (0, help_text), option
